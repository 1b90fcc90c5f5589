#!/usr/bin/env python3
"""tools/text-conformance/check_template_refs.py — cross-checks tests/text/template-refs-NAME.jsonl against Python jinja2 set up as transformers does.

Usage: python3 tools/text-conformance/check_template_refs.py DATA [--write] [NAME...]

DATA/NAME/tokenizer_config.json holds a template, or for a NAME with a committed template
tests/text/templates/NAME.jinja does (its bos_token and eos_token in
tests/text/templates/special_tokens.json), as for make_template_refs.js.

The refs come from @huggingface/jinja (make_template_refs.js). transformers renders chat templates with
Python jinja2 (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, tojson as
json.dumps(ensure_ascii=False), a raise_exception global), and that is what the C interpreter follows.
Where the two oracles disagree, the line gets a "transformers_output" (or "transformers_error") field
with --write; the C test then expects that one. Known cause: @huggingface/jinja 0.5.11 ignores the
argument of str.strip/lstrip/rstrip (x.lstrip('\\n') strips all whitespace, NBSP included).
Without --write, exits 1 when a disagreement is not recorded in the file as it stands.
"""
import json
import os
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
TEMPLATES = os.path.join(ROOT, "tests", "text", "templates")
NAMES = ["qwen3", "llama3", "gemma3", "phi3.5-mini", "phi4-mini"]


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def token_text(v):
    if isinstance(v, dict):
        return v.get("content")
    return v


def template_config(data, name):
    """What the render needs of tokenizer_config.json: chat_template, bos_token, eos_token."""
    jinja = os.path.join(TEMPLATES, f"{name}.jinja")
    if os.path.exists(jinja):
        with open(os.path.join(TEMPLATES, "special_tokens.json"), encoding="utf-8") as f:
            cfg = dict(json.load(f)[name])
        with open(jinja, encoding="utf-8", newline="") as f:
            cfg["chat_template"] = f.read()
        return cfg
    with open(os.path.join(data, name, "tokenizer_config.json"), encoding="utf-8") as f:
        return json.load(f)


def main():
    args = [a for a in sys.argv[1:] if a != "--write"]
    write = "--write" in sys.argv[1:]
    if not args:
        print(__doc__, file=sys.stderr)
        return 2
    data, names = args[0], args[1:] or NAMES
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    with open(os.path.join(ROOT, "tests", "text", "conversations.jsonl"), encoding="utf-8") as f:
        convs = {c["id"]: c for c in map(json.loads, f)}
    unrecorded = 0
    for name in names:
        cfg = template_config(data, name)
        template = env.from_string(cfg["chat_template"])
        path = os.path.join(ROOT, "tests", "text", f"template-refs-{name}.jsonl")
        with open(path, encoding="utf-8") as f:
            refs = [json.loads(line) for line in f]
        diverged = 0
        for ref in refs:
            recorded = (ref.get("transformers_output"), ref.get("transformers_error"))
            ref.pop("transformers_output", None)
            ref.pop("transformers_error", None)
            c = convs[ref["id"]]
            ctx = {"messages": c["messages"], "add_generation_prompt": c["add_generation_prompt"],
                   "bos_token": token_text(cfg.get("bos_token")), "eos_token": token_text(cfg.get("eos_token"))}
            if "tools" in c:
                ctx["tools"] = c["tools"]
            if "enable_thinking" in c:
                ctx["enable_thinking"] = c["enable_thinking"]
            try:
                got = {"output": template.render(**ctx)}
            except jinja2.exceptions.TemplateError as e:
                got = {"error": str(e)}
            if got.get("output") == ref.get("output") and got.get("error") == ref.get("error"):
                if recorded != (None, None):
                    unrecorded += 1
                continue
            diverged += 1
            if "output" in got:
                ref["transformers_output"] = got["output"]
            else:
                ref["transformers_error"] = got["error"]
            if recorded != (ref.get("transformers_output"), ref.get("transformers_error")):
                unrecorded += 1
            if diverged <= 3:
                print(f"{name} id {ref['id']}: @huggingface/jinja {json.dumps(ref.get('output', ref.get('error')))[:160]}\n"
                      f"{' ' * len(name)}    transformers      {json.dumps(got.get('output', got.get('error')))[:160]}",
                      file=sys.stderr)
        print(f"check_template_refs: {name}: {len(refs)} renders, {diverged} differ from transformers' jinja2", file=sys.stderr)
        if write:
            with open(path, "w", encoding="utf-8") as f:
                for ref in refs:
                    f.write(json.dumps(ref, ensure_ascii=False, separators=(",", ":")) + "\n")
    if unrecorded and not write:
        print(f"check_template_refs: {unrecorded} disagreements differ from what the refs record; rerun with --write",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
