#!/usr/bin/env python3
"""tools/train/train_house.py — trains the house tokenizer and models (house, house-draft) and measures them.

Run where torch, transformers and tokenizers exist (on one H200 it takes about
two and a half minutes), after tools/train/make_corpus.py has written the corpus:

  python3 tools/train/train_house.py --corpus build/house-corpus \
      --heldout tests/goldens/house/heldout.txt --out OUT

What it does, in order:
  1. a byte-level BPE tokenizer (vocab 8192) on the training documents;
  2. the training stream: every document once as plain text and once wrapped in the
     ChatML template (user = the passage start, assistant = its continuation), shuffled,
     each followed by <|endoftext|>; 2% of the training documents are kept aside as
     validation (early stopping and checkpoint choice);
  3. house: trained on random 1024-token windows of the stream until validation loss stops
     improving; house-draft: trained on windows of the same stream and, half of each batch,
     of house's own continuations of prompts from the training documents (half greedy, half
     sampled), its loss mixing cross-entropy with the KL divergence to house's distribution
     (distillation), keeping the checkpoint whose greedy agreement with house on validation
     is best (--draft-only HOUSE_DIR keeps that house and trains only the draft);
  4. the measurements of models/house/README.md (with the draft's agreement on house's
     greedy continuations of held-out prompts, what speculative decoding accepts) and the
     golden of tests/goldens/house,
     from the saved bf16 files reloaded with transformers in float32 with eager attention
     (what the C engine's exact mode computes), not from the in-memory training copy.

Writes under OUT:
  house/, house-draft/   Hugging Face model directories (config.json, generation_config.json,
                         model.safetensors in bf16, tokenizer.json, tokenizer_config.json)
  perplexity.json        the golden tests/goldens/house/perplexity.json (see tests/goldens/house/README.md)
  results.json           sizes, training time and curves, perplexities, agreement, samples
  log.txt                the training log
"""
import argparse
import copy
import json
import math
import os
import random
import shutil
import sys
import time

import torch
import torch.nn.functional as F

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
EOT_ID, IM_START_ID, IM_END_ID = 0, 1, 2
VOCAB = 8192
SEQ_LEN = 1024
WINDOW = 256  # perplexity window (tokens)
SYSTEM_PROMPT = "You are a helpful assistant."
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# name -> Qwen3 shape and training settings
SHAPES = {
    "house": dict(hidden_size=384, intermediate_size=1024, num_hidden_layers=6,
                  num_attention_heads=6, num_key_value_heads=2, head_dim=64,
                  lr=1.5e-3, epochs=10, seconds=150, dropout=0.1),
    "house-draft": dict(hidden_size=192, intermediate_size=512, num_hidden_layers=2,
                        num_attention_heads=3, num_key_value_heads=1, head_dim=64,
                        lr=3e-3, epochs=20, seconds=420, dropout=0.0, patience=10),
}
# The draft's data besides the corpus stream: house's own continuations of prompts cut from the
# training documents (on-policy distillation: speculative decoding verifies drafts against the
# text house generates, not against the corpus), half greedy and half sampled as
# generation_config.json says; GENERATED_SHARE of each draft batch comes from them.
GENERATED = 12000
GENERATED_TOKENS = 256
PROMPT_TOKENS = 256  # a prompt's last tokens that house continues
GENERATED_SHARE = 0.5

LOG = None


def log(*a):
    msg = " ".join(str(x) for x in a)
    print(msg, flush=True)
    if LOG:
        LOG.write(msg + "\n")
        LOG.flush()


# ------------------------------------------------------------------ tokenizer

def train_tokenizer(texts, out_dir, strict=True):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, min_frequency=2, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer, length=len(texts))
    assert [tok.token_to_id(s) for s in SPECIALS] == [EOT_ID, IM_START_ID, IM_END_ID]
    assert tok.get_vocab_size() == VOCAB or not strict, tok.get_vocab_size()
    write_tokenizer(tok, out_dir)
    return tok


def write_tokenizer(tok, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    added = {str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False, "special": True} for i, s in enumerate(SPECIALS)}
    cfg = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": "<|endoftext|>",
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": SEQ_LEN,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2, ensure_ascii=False)
        f.write("\n")


# ------------------------------------------------------------------ data

def chat_pair(text, rng):
    """Splits a document into (user, assistant): the passage start and its continuation."""
    lines = text.split("\n")
    if len(lines) >= 2:
        k = 1
        while k < len(lines) - 1 and len("\n".join(lines[:k])) < 30:
            k += 1
        user, rest = "\n".join(lines[:k]), lines[k:]
        out, n = [], 0
        for ln in rest:  # keep the answer to a few hundred tokens
            if out and n + len(ln) > 1500:
                break
            out.append(ln)
            n += len(ln) + 1
        return user, "\n".join(out)
    words = text.split(" ")
    if len(words) < 3:
        return None
    cut = max(1, min(len(words) - 1, int(len(words) * rng.uniform(0.3, 0.5))))
    return " ".join(words[:cut]), " ".join(words[cut:])


def render_chat(user, assistant, system):
    s = ""
    if system:
        s += f"<|im_start|>system\n{system}<|im_end|>\n"
    s += f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n{assistant}<|im_end|>\n"
    return s


def build_stream(tok, docs, seed):
    """Every document twice: as plain text and wrapped in the chat template; shuffled, each
    followed by <|endoftext|>, concatenated."""
    rng = random.Random(seed)
    samples = list(docs)
    n_chat = 0
    for d in docs:
        pair = chat_pair(d, rng)
        if pair:
            samples.append(render_chat(pair[0], pair[1], SYSTEM_PROMPT if rng.random() < 0.25 else None))
            n_chat += 1
    rng.shuffle(samples)
    enc = tok.encode_batch(samples)
    ids = []
    for e in enc:
        ids.extend(e.ids)
        ids.append(EOT_ID)
    return torch.tensor(ids, dtype=torch.int32), n_chat


def continuation_prompt(doc, rng):
    """A prompt cut from a document as a user would give it: the passage start as plain text
    (its first 4-40 words) or as a chat turn waiting for the assistant's answer."""
    if rng.random() < 0.5:
        pair = chat_pair(doc, rng)
        if pair:
            system = f"<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n" if rng.random() < 0.25 else ""
            return f"{system}<|im_start|>user\n{pair[0]}<|im_end|>\n<|im_start|>assistant\n"
    words = doc.split(" ")
    return " ".join(words[:rng.randint(4, 40)])


@torch.no_grad()
def house_continuations(house, tok, prompts, device, greedy, new_tokens=GENERATED_TOKENS, batch=1024):
    """Per prompt, the token ids of its last PROMPT_TOKENS followed by house's continuation, up
    to and with the first end token (<|im_end|> or <|endoftext|>), and how many of them are the
    prompt's: greedy, or sampled with the settings of generation_config.json (temperature 0.7,
    top-k 40, top-p 0.9, repetition penalty 1.1)."""
    house.eval()
    out = []
    for i in range(0, len(prompts), batch):
        enc = [e.ids[-PROMPT_TOKENS:] for e in tok.encode_batch(prompts[i:i + batch])]
        width = max(len(e) for e in enc)
        ids = torch.full((len(enc), width), EOT_ID, dtype=torch.long)
        mask = torch.zeros((len(enc), width), dtype=torch.long)
        for r, e in enumerate(enc):  # left padding: every row's last prompt token lines up
            ids[r, width - len(e):] = torch.tensor(e)
            mask[r, width - len(e):] = 1
        settings = dict(do_sample=False, repetition_penalty=1.0, temperature=None, top_k=None,
                        top_p=None) if greedy else dict(
            do_sample=True, temperature=0.7, top_k=40, top_p=0.9, repetition_penalty=1.1)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            gen = house.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                                 max_new_tokens=new_tokens, min_new_tokens=1,
                                 pad_token_id=EOT_ID, eos_token_id=[IM_END_ID, EOT_ID], **settings)
        for r, e in enumerate(enc):
            cont = gen[r, width:].tolist()
            for j, t in enumerate(cont):
                if t in (IM_END_ID, EOT_ID):
                    cont = cont[:j + 1]
                    break
            out.append((e + cont, len(e)))
    return out


def generated_stream(house, tok, docs, n, device, seed):
    """n continuations by house (half greedy, half sampled) of prompts from docs, shuffled and
    concatenated, each ending in <|endoftext|>."""
    rng = random.Random(seed)
    prompts = [continuation_prompt(rng.choice(docs), rng) for _ in range(n)]
    torch.manual_seed(seed)
    seqs = (house_continuations(house, tok, prompts[: n // 2], device, greedy=True)
            + house_continuations(house, tok, prompts[n // 2:], device, greedy=False))
    rng.shuffle(seqs)
    ids = []
    for seq, _ in seqs:
        ids.extend(seq)
        if seq[-1] != EOT_ID:
            ids.append(EOT_ID)
    return torch.tensor(ids, dtype=torch.int32)


def heldout_windows(ids):
    n = len(ids) // WINDOW
    return torch.tensor(ids[: n * WINDOW], dtype=torch.long).view(n, WINDOW)


# ------------------------------------------------------------------ model

def make_config(shape, max_pos):
    from transformers import Qwen3Config
    keys = ["hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim"]
    return Qwen3Config(vocab_size=VOCAB, max_position_embeddings=max_pos, rms_norm_eps=1e-6,
                       tie_word_embeddings=True, use_sliding_window=False, attention_dropout=0.0,
                       bos_token_id=EOT_ID, eos_token_id=IM_END_ID, pad_token_id=EOT_ID,
                       **{k: shape[k] for k in keys})


def n_params(model):
    return sum(p.numel() for p in model.parameters())


@torch.no_grad()
def eval_windows(model, windows, device, teacher=None, batch=64):
    """Mean NLL per predicted token over windows, and (with a teacher) the fraction of
    positions where model and teacher have the same argmax."""
    model.eval()
    tot, cnt, agree = 0.0, 0, 0
    for i in range(0, windows.shape[0], batch):
        x = windows[i:i + batch].to(device)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = model(input_ids=x).logits
            if teacher is not None:
                agree += int((teacher(input_ids=x).logits.argmax(-1) == logits.argmax(-1)).sum().item())
        nll = F.cross_entropy(logits[:, :-1].float().reshape(-1, VOCAB), x[:, 1:].reshape(-1),
                              reduction="sum")
        tot += nll.item()
        cnt += x[:, 1:].numel()
    model.train()
    return tot / cnt, agree / windows.numel()


def add_residual_dropout(model, p):
    """Dropout on each decoder layer's output (Qwen3 itself has none but attention dropout)."""
    if p <= 0:
        return

    def hook(module, inputs, output):
        if not module.training:
            return output
        if isinstance(output, tuple):
            return (F.dropout(output[0], p, True),) + tuple(output[1:])
        return F.dropout(output, p, True)

    for layer in model.model.layers:
        layer.register_forward_hook(hook)


def train_model(name, stream, windows, device, args, teacher=None, extra=None):
    """Trains on random SEQ_LEN windows of stream (and, with extra, GENERATED_SHARE of each batch
    from extra); every eval_every steps measures the validation windows and keeps the best
    checkpoint: lowest loss, or with a teacher (the draft), highest greedy agreement with it.
    Stops after `patience` evaluations without improvement (the shape's own, else --patience)."""
    from transformers import AutoModelForCausalLM
    shape = SHAPES[name]
    torch.manual_seed(1234)
    cfg = make_config(shape, SEQ_LEN)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").to(device)
    add_residual_dropout(model, shape["dropout"])
    model.train()
    params = n_params(model)
    bsz = args.batch
    tokens_per_step = bsz * SEQ_LEN
    n_extra = int(round(bsz * GENERATED_SHARE)) if extra is not None else 0
    data_tokens = len(stream) + (len(extra) if extra is not None else 0)
    max_steps = args.max_steps or max(1, int(shape["epochs"] * data_tokens / tokens_per_step))
    patience = shape.get("patience", args.patience)
    seconds = args.seconds_scale * shape["seconds"]
    warmup = min(200, max_steps // 10 + 1)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=shape["lr"], betas=(0.9, 0.95), eps=1e-8,
                            fused=device.type == "cuda")
    log(f"{name}: {params} parameters, {len(stream)} stream tokens"
        f"{f' + {len(extra)} generated by house ({n_extra} of {bsz} windows a step)' if n_extra else ''}, "
        f"{max_steps} steps max, "
        f"{tokens_per_step} tokens/step, {seconds:.0f} s max, dropout {shape['dropout']}, "
        f"{'distilled from house' if teacher is not None else 'plain cross-entropy'}")
    gen = torch.Generator().manual_seed(99)
    best = (-float("inf"), None, 0)
    curve = []
    bad_evals = 0
    t0 = time.time()
    step = 0
    stream_dev = stream.to(device)
    extra_dev = extra.to(device) if n_extra else None
    while step < max_steps:
        lr = shape["lr"] * min(1.0, (step + 1) / warmup)
        if step >= warmup:
            frac = (step - warmup) / max(1, max_steps - warmup)
            lr = shape["lr"] * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        span = torch.arange(SEQ_LEN + 1, device=device)[None, :]
        starts = torch.randint(0, len(stream) - SEQ_LEN - 1, (bsz - n_extra,), generator=gen).to(device)
        chunk = stream_dev[starts[:, None] + span].long()
        if n_extra:
            starts = torch.randint(0, len(extra) - SEQ_LEN - 1, (n_extra,), generator=gen).to(device)
            chunk = torch.cat([chunk, extra_dev[starts[:, None] + span].long()])
        x, y = chunk[:, :-1], chunk[:, 1:]
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = model(input_ids=x).logits
            if teacher is not None:
                with torch.no_grad():
                    t_logits = teacher(input_ids=x).logits
        logits = logits.float().reshape(-1, VOCAB)
        loss = F.cross_entropy(logits, y.reshape(-1))
        ce = loss
        if teacher is not None:
            kl = F.kl_div(F.log_softmax(logits, -1), F.log_softmax(t_logits.float().reshape(-1, VOCAB), -1),
                          log_target=True, reduction="batchmean")
            loss = args.distill * kl + (1 - args.distill) * ce
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % args.eval_every == 0 or step == max_steps:
            vl, va = eval_windows(model, windows, device, teacher)
            el = time.time() - t0
            score = va if teacher is not None else -vl
            curve.append({"step": step, "seconds": round(el, 1), "train_ce": round(ce.item(), 4),
                          "val_loss": round(vl, 4), "val_agreement": round(va, 4), "lr": lr})
            log(f"{name} step {step} {el:.0f}s train ce {ce.item():.4f} val loss {vl:.4f} "
                f"agreement {va:.4f} lr {lr:.2e}")
            if score > best[0] + (2e-4 if teacher is not None else 1e-3):
                best = (score, copy.deepcopy(model.state_dict()), step)
                bad_evals = 0
            else:
                bad_evals += 1
            if bad_evals >= patience:
                log(f"{name}: validation stopped improving (best at step {best[2]})")
                break
            if el > seconds:
                log(f"{name}: time budget reached")
                break
    train_seconds = time.time() - t0
    model.load_state_dict(best[1])
    model.eval()
    return model, {"parameters": params, "steps": step, "best_step": best[2],
                   "tokens_per_step": tokens_per_step, "tokens_seen": step * tokens_per_step,
                   "train_seconds": round(train_seconds, 1),
                   "selected_by": "validation greedy agreement with house" if teacher is not None
                   else "validation loss",
                   "curve": curve, "shape": {k: v for k, v in SHAPES[name].items()}}


def save_model(model, tok, out_dir, tokenizer_dir=None):
    """The model in bf16 with its generation defaults and tokenizer files (tokenizer_dir's own,
    byte for byte, when given)."""
    from transformers import GenerationConfig
    model = copy.deepcopy(model).to(torch.bfloat16).cpu()
    model.config.max_position_embeddings = SEQ_LEN
    try:
        model.save_pretrained(out_dir, safe_serialization=True)
    except TypeError:  # transformers versions that always write safetensors
        model.save_pretrained(out_dir)
    assert os.path.exists(os.path.join(out_dir, "model.safetensors"))
    gc = GenerationConfig(bos_token_id=EOT_ID, eos_token_id=[IM_END_ID, EOT_ID], pad_token_id=EOT_ID,
                          do_sample=True, temperature=0.7, top_p=0.9, top_k=40,
                          repetition_penalty=1.1)
    gc.save_pretrained(out_dir)
    if tokenizer_dir:
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(tokenizer_dir, f), os.path.join(out_dir, f))
    else:
        write_tokenizer(tok, out_dir)


# ------------------------------------------------------------------ evaluation

def load_eval(dir_, device):
    from transformers import AutoModelForCausalLM
    try:
        m = AutoModelForCausalLM.from_pretrained(dir_, dtype=torch.float32, attn_implementation="eager")
    except TypeError:
        m = AutoModelForCausalLM.from_pretrained(dir_, torch_dtype=torch.float32, attn_implementation="eager")
    return m.float().to(device).eval()


@torch.no_grad()
def window_stats(main, draft, windows, device):
    """Per window: NLL sums of both models (float64) and greedy agreement of draft with main."""
    out = []
    for i in range(windows.shape[0]):
        x = windows[i:i + 1].to(device)
        lm = main(input_ids=x).logits[0].double()
        ld = draft(input_ids=x).logits[0].double()
        tgt = x[0, 1:]
        nll_m = F.cross_entropy(lm[:-1], tgt, reduction="sum").item()
        nll_d = F.cross_entropy(ld[:-1], tgt, reduction="sum").item()
        am, ad = lm.argmax(-1), ld.argmax(-1)
        out.append({"nll_main": nll_m, "nll_draft": nll_d,
                    "agree": int((am == ad).sum().item()),
                    "main_correct": int((am[:-1] == tgt).sum().item())})
    return out


@torch.no_grad()
def continuation_agreement(main, drafts, tok, heldout_text, device, n_prompts=128, new_tokens=128):
    """What greedy speculative decoding meets: house's greedy continuations (new_tokens) of the
    held-out documents' first 30 words (those of 40 words and more, as bench/spec_bench.sh
    picks its prompts), and per draft the fraction of the continuations' positions where its
    argmax equals house's."""
    docs = [d for d in heldout_text.split("<|endoftext|>") if len(d.split(" ")) >= 40]
    docs = docs[:: max(1, len(docs) // n_prompts)][:n_prompts]
    prompts = [" ".join(d.split(" ")[:30]) for d in docs]
    agree, total = [0] * len(drafts), 0
    for seq, n_p in house_continuations(main, tok, prompts, device, greedy=True,
                                        new_tokens=new_tokens):
        x = torch.tensor([seq], device=device)
        # positions n_p - 1 .. predict the continuation's tokens
        am = main(input_ids=x).logits[0, n_p - 1:len(seq) - 1].argmax(-1)
        total += am.numel()
        for i, d in enumerate(drafts):
            agree[i] += int((d(input_ids=x).logits[0, n_p - 1:len(seq) - 1].argmax(-1) == am).sum().item())
    return [a / max(1, total) for a in agree], total


@torch.no_grad()
def generate(model, tok, prompt, chat, device, n=60, sample=False, seed=0):
    """Continuation by hand (full forwards), so no library generation defaults apply: greedy, or
    sampled as generation_config.json says (repetition penalty 1.1, temperature 0.7, top-k 40,
    top-p 0.9)."""
    text = f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n" if chat else prompt
    ids = tok.encode(text).ids
    g = torch.Generator(device=device).manual_seed(seed)
    out = []
    for _ in range(n):
        x = torch.tensor([ids + out], device=device)
        logits = model(input_ids=x).logits[0, -1].float()
        if sample:
            seen = torch.tensor(sorted(set(ids + out)), device=device)
            v = logits[seen]
            logits[seen] = torch.where(v > 0, v / 1.1, v * 1.1)
            logits = logits / 0.7
            top = torch.topk(logits, 40)
            probs = torch.softmax(top.values, -1)
            keep = (torch.cumsum(probs, -1) - probs) < 0.9
            probs = probs * keep
            nxt = int(top.indices[torch.multinomial(probs / probs.sum(), 1, generator=g)].item())
        else:
            nxt = int(logits.argmax().item())
        if nxt in (IM_END_ID, EOT_ID):
            break
        out.append(nxt)
    return tok.decode(out)


PROMPTS = [("In the beginning", False), ("The meaning of life is", False),
           ("A computer", False), ("And the LORD spake unto Moses, saying,", True),
           ("Tell me about the sea.", True), ("What is a cynic?", True)]


def main():
    global LOG
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", default="build/house-corpus")
    ap.add_argument("--heldout", default="tests/goldens/house/heldout.txt")
    ap.add_argument("--out", required=True)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--patience", type=int, default=3)
    ap.add_argument("--distill", type=float, default=0.7,
                    help="weight of the KL to house in the draft's loss (the rest is cross-entropy)")
    ap.add_argument("--max-steps", type=int, default=0, help="override (smoke tests)")
    ap.add_argument("--seconds-scale", type=float, default=1.0)
    ap.add_argument("--limit-docs", type=int, default=0, help="use only this many documents (smoke tests)")
    ap.add_argument("--limit-windows", type=int, default=0, help="evaluate only this many windows (smoke tests)")
    ap.add_argument("--generated", type=int, default=GENERATED,
                    help="house continuations in the draft's data (0: the corpus stream alone)")
    ap.add_argument("--draft-only", metavar="HOUSE_DIR",
                    help="keep this house (weights and tokenizer) and train only the draft; its "
                         "training/ log and results are carried over")
    ap.add_argument("--compare-draft", metavar="DIR",
                    help="an earlier draft whose agreement with house is measured beside the new one")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    LOG = open(os.path.join(args.out, "log.txt"), "w")
    earlier = {}
    if args.draft_only:
        training = os.path.join(args.draft_only, "training")
        if os.path.exists(os.path.join(training, "log.txt")):
            with open(os.path.join(training, "log.txt"), encoding="utf-8") as f:
                LOG.write(f.read().rstrip("\n") + "\n")
            LOG.write(f"---- house-draft retrained alone (--draft-only), house kept\n")
        if os.path.exists(os.path.join(training, "results.json")):
            with open(os.path.join(training, "results.json"), encoding="utf-8") as f:
                earlier = json.load(f)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    import transformers
    import tokenizers
    log(f"torch {torch.__version__} transformers {transformers.__version__} tokenizers "
        f"{tokenizers.__version__} device {device} "
        f"{torch.cuda.get_device_name() if device.type == 'cuda' else ''}")
    t_all = time.time()

    with open(os.path.join(args.corpus, "train.jsonl"), encoding="utf-8") as f:
        all_docs = [json.loads(line)["text"] for line in f]
    # Validation (early stopping, checkpoint choice): 2% of the training documents, never trained on.
    docs = [d for i, d in enumerate(all_docs) if i % 50 != 24]
    val_docs = [d for i, d in enumerate(all_docs) if i % 50 == 24]
    if args.limit_docs:
        docs = docs[:: max(1, len(docs) // args.limit_docs)]
    with open(args.heldout, encoding="utf-8") as f:
        heldout_text = f.read()

    t = time.time()
    if args.draft_only:
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(os.path.join(args.draft_only, "tokenizer.json"))
        log(f"tokenizer: house's own, {tok.get_vocab_size()} tokens")
    else:
        tok = train_tokenizer(docs, os.path.join(args.out, "tokenizer"), strict=not args.limit_docs)
        log(f"tokenizer: {tok.get_vocab_size()} tokens in {time.time() - t:.1f}s")
    plain_tokens = sum(len(e.ids) + 1 for e in tok.encode_batch(docs))
    stream, n_chat = build_stream(tok, docs, seed=7)
    heldout_ids = tok.encode(heldout_text).ids
    windows = heldout_windows(heldout_ids)
    val_windows = heldout_windows(tok.encode("<|endoftext|>".join(val_docs)).ids)
    if args.limit_windows:
        windows = windows[: args.limit_windows]
        val_windows = val_windows[: args.limit_windows]
    log(f"corpus: {len(docs)} training documents = {plain_tokens} tokens as plain text; "
        f"training stream (plain + {n_chat} chat-wrapped) {len(stream)} tokens; held-out "
        f"{len(heldout_ids)} tokens, {windows.shape[0]} windows of {WINDOW}; validation "
        f"{len(val_docs)} documents, {val_windows.shape[0]} windows")

    results = {"versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                            "tokenizers": tokenizers.__version__,
                            "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu"},
               "corpus": {"train_documents": len(docs), "train_tokens_plain": plain_tokens,
                          "chat_samples": n_chat, "stream_tokens": len(stream),
                          "heldout_tokens": len(heldout_ids), "validation_documents": len(val_docs),
                          "validation_tokens": int(val_windows.numel())},
               "models": {}}
    dirs = {}
    teacher = None
    names = ["house", "house-draft"]
    if args.draft_only:
        from transformers import AutoModelForCausalLM
        dirs["house"] = args.draft_only
        teacher = AutoModelForCausalLM.from_pretrained(
            args.draft_only, dtype=torch.float32, attn_implementation="sdpa").to(device).eval()
        if "house" in earlier.get("models", {}):
            results["models"]["house"] = earlier["models"]["house"]
        names = ["house-draft"]
    for name in names:
        extra = None
        if teacher is not None and args.generated > 0:
            t = time.time()
            extra = generated_stream(teacher, tok, docs, args.generated, device, seed=11)
            log(f"{name}: house continued {args.generated} prompts of the training documents "
                f"(half greedy, half sampled): {len(extra)} tokens in {time.time() - t:.1f}s")
        model, info = train_model(name, stream, val_windows, device, args, teacher, extra)
        if extra is not None:
            info["generated"] = {"continuations": args.generated, "tokens": len(extra),
                                 "max_new_tokens": GENERATED_TOKENS, "share": GENERATED_SHARE}
        dirs[name] = os.path.join(args.out, name)
        save_model(model, tok, dirs[name], tokenizer_dir=args.draft_only)
        results["models"][name] = info
        teacher = model
    del teacher, model
    torch.cuda.empty_cache() if device.type == "cuda" else None

    # Evaluation from the saved files.
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(dirs["house"], "tokenizer.json"))
    assert tok.encode(heldout_text).ids == heldout_ids
    try:  # the saved directory must also load as transformers loads it
        from transformers import AutoTokenizer
        hf_tok = AutoTokenizer.from_pretrained(dirs["house"])
        hf_ids = hf_tok(heldout_text, add_special_tokens=False).input_ids
        rendered = hf_tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                                              add_generation_prompt=True)
        results["autotokenizer"] = {"class": type(hf_tok).__name__, "ids_equal": hf_ids == heldout_ids,
                                    "chat_rendered": rendered, "eos_token": hf_tok.eos_token,
                                    "bos_token": hf_tok.bos_token, "pad_token": hf_tok.pad_token}
        log(f"AutoTokenizer: {results['autotokenizer']}")
    except Exception as e:  # reported, not fatal: the goldens do not depend on it
        results["autotokenizer"] = {"error": repr(e)}
        log(f"AutoTokenizer check failed: {e!r}")
    with open(os.path.join(dirs["house"], "config.json")) as f:
        log("config.json: " + f.read())
    main_m = load_eval(dirs["house"], device)
    draft_m = load_eval(dirs["house-draft"], device)
    for name, m in [("house", main_m), ("house-draft", draft_m)]:
        results["models"][name]["parameters_saved"] = n_params(m)
    stats = window_stats(main_m, draft_m, windows, device)
    n_pred = windows.shape[0] * (WINDOW - 1)
    n_pos = windows.shape[0] * WINDOW
    ppl_main = math.exp(sum(s["nll_main"] for s in stats) / n_pred)
    ppl_draft = math.exp(sum(s["nll_draft"] for s in stats) / n_pred)
    acceptance = sum(s["agree"] for s in stats) / n_pos
    log(f"held-out perplexity (transformers, fp32 eager, {windows.shape[0]} windows of {WINDOW}): "
        f"house {ppl_main:.4f}, house-draft {ppl_draft:.4f}; greedy agreement {acceptance:.4f}")
    drafts = [draft_m] + ([load_eval(args.compare_draft, device)] if args.compare_draft else [])
    cont, cont_n = continuation_agreement(main_m, drafts, tok, heldout_text, device)
    log(f"greedy agreement on house's greedy continuations of held-out prompts ({cont_n} "
        f"positions): house-draft {cont[0]:.4f}"
        f"{f', the earlier draft {cont[1]:.4f}' if args.compare_draft else ''}")
    results["heldout"] = {"windows": int(windows.shape[0]), "window": WINDOW,
                          "continuation_agreement": cont[0], "continuation_positions": cont_n,
                          **({"continuation_agreement_earlier_draft": cont[1]} if args.compare_draft else {}),
                          "ppl_house": ppl_main, "ppl_house_draft": ppl_draft,
                          "greedy_agreement": acceptance,
                          "main_top1_accuracy": sum(s["main_correct"] for s in stats) / n_pred}
    golden = {
        "what": "held-out perplexity of models/house and models/house-draft, and the draft's "
                "greedy agreement with the main model; see tests/goldens/house/README.md",
        "heldout_file": "heldout.txt", "window": WINDOW,
        "transformers_version": transformers.__version__, "torch_version": torch.__version__,
        "dtype": "float32", "attn_implementation": "eager",
        "n_tokens": len(heldout_ids), "n_windows": int(windows.shape[0]),
        "ppl_house": ppl_main, "ppl_house_draft": ppl_draft, "greedy_agreement": acceptance,
        "windows_stats": [{"nll_house": round(s["nll_main"], 6), "nll_house_draft": round(s["nll_draft"], 6),
                           "agree": s["agree"]} for s in stats],
        "tokens": heldout_ids,
    }
    with open(os.path.join(args.out, "perplexity.json"), "w") as f:
        json.dump(golden, f, separators=(",", ":"))
        f.write("\n")

    samples = []
    for name, m in [("house", main_m), ("house-draft", draft_m)]:
        for prompt, chat in PROMPTS:
            text = generate(m, tok, prompt, chat, device)
            samples.append({"model": name, "prompt": prompt, "chat": chat, "output": text})
            log(f"[{name}{' chat' if chat else ''}] {prompt!r} -> {text!r}")
    results["greedy_samples"] = samples
    sampled = []
    for prompt, chat in PROMPTS:
        text = generate(main_m, tok, prompt, chat, device, n=80, sample=True, seed=1)
        sampled.append({"model": "house", "prompt": prompt, "chat": chat, "output": text})
        log(f"[house sampled{' chat' if chat else ''}] {prompt!r} -> {text!r}")
    results["sampled_outputs"] = sampled
    results["total_seconds"] = round(time.time() - t_all, 1)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1, ensure_ascii=False)
        f.write("\n")
    log(f"done in {results['total_seconds']}s")


if __name__ == "__main__":
    main()
