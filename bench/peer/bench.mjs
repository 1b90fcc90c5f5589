// bench/peer/bench.mjs — llama.cpp (node-llama-cpp's prebuilt CPU libraries) on a GGUF file: prefill of P random tokens, greedy decode of G tokens, with N threads.
//
// Usage: node bench.mjs FILE.gguf [--prompt-len P] [--gen-len G] [--threads N] [--reps R]
// Prints one JSON line: medians over R repetitions (after one untimed warm-up
// of each phase), the ggml CPU variant llama.cpp chose for this processor,
// and the raw figures. run.sh alternates this with `inferd bench`.
import { getLlama, LlamaLogLevel } from "node-llama-cpp";

function parseArgs(argv) {
    const o = { file: null, promptLen: 128, genLen: 32, threads: 2, reps: 1 };
    for (let i = 0; i < argv.length; i++) {
        const a = argv[i];
        const num = () => {
            const v = Number(argv[++i]);
            if (!Number.isInteger(v) || v < 1) throw new Error(`${a} takes a positive integer`);
            return v;
        };
        if (a === "--prompt-len") o.promptLen = num();
        else if (a === "--gen-len") o.genLen = num();
        else if (a === "--threads") o.threads = num();
        else if (a === "--reps") o.reps = num();
        else if (!a.startsWith("--") && !o.file) o.file = a;
        else throw new Error(`unknown argument '${a}'`);
    }
    if (!o.file) throw new Error("usage: node bench.mjs FILE.gguf [--prompt-len P] [--gen-len G] [--threads N] [--reps R]");
    return o;
}

const median = (v) => {
    const s = [...v].sort((a, b) => a - b);
    return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};

// The same made-up prompt every run: ids drawn by an LCG from the middle of
// the vocabulary (clear of special tokens at either end).
function promptTokens(n, vocab) {
    const lo = Math.min(1000, Math.floor(vocab / 4)), span = Math.max(1, Math.floor(vocab / 2));
    let s = 12345;
    const out = [];
    for (let i = 0; i < n; i++) {
        s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
        out.push(lo + (s % span));
    }
    return out;
}

async function main() {
    const o = parseArgs(process.argv.slice(2));
    let variant = "unknown";
    const llama = await getLlama({
        gpu: false,
        build: "never",
        maxThreads: o.threads,
        logLevel: LlamaLogLevel.debug, // the CPU variant is announced at debug level
        logger: (level, message) => {
            // ggml announces the per-ISA CPU library it loaded.
            const m = /libggml-cpu-([\w]+)\.so/.exec(message);
            if (m) variant = m[1];
            if (level === LlamaLogLevel.error || level === LlamaLogLevel.fatal) process.stderr.write(message);
        },
    });
    const model = await llama.loadModel({ modelPath: o.file, gpuLayers: 0 });
    const vocab = model.fileInfo.metadata?.tokenizer?.ggml?.tokens?.length ?? 32000;
    const tokens = promptTokens(o.promptLen, vocab);
    const context = await model.createContext({
        contextSize: Math.ceil((o.promptLen + o.genLen + 64) / 256) * 256,
        batchSize: Math.max(512, o.promptLen),
        threads: { ideal: o.threads, min: o.threads },
        sequences: 1,
    });
    const seq = context.getSequence();

    async function prefill() {
        await seq.clearHistory();
        const t0 = process.hrtime.bigint();
        await seq.evaluateWithoutGeneratingNewTokens(tokens);
        return Number(process.hrtime.bigint() - t0) / 1e9;
    }
    // G forward passes of one token each after the prompt: the first feeds the
    // prompt's last token again as a decode step, every later one the token
    // just chosen (greedy: temperature 0).
    async function decode() {
        await seq.clearHistory();
        await seq.evaluateWithoutGeneratingNewTokens(tokens.slice(0, -1));
        const t0 = process.hrtime.bigint();
        let n = 0;
        for await (const _ of seq.evaluate(tokens.slice(-1), { temperature: 0 })) {
            if (++n >= o.genLen) break;
        }
        return { s: Number(process.hrtime.bigint() - t0) / 1e9, n };
    }

    await prefill(); // warm-up: first-touch of the mapped weights, thread start
    await decode();
    const pre = [], dec = [];
    for (let r = 0; r < o.reps; r++) {
        pre.push(o.promptLen / (await prefill()));
        const d = await decode();
        dec.push(d.n / d.s);
    }
    console.log(JSON.stringify({
        engine: "llama.cpp", package: "node-llama-cpp@3.21.1", cpu_variant: variant,
        threads: o.threads, prompt_len: o.promptLen, gen_len: o.genLen,
        prefill_tps: median(pre), decode_tps: median(dec), prefill_runs: pre, decode_runs: dec,
    }));
    await context.dispose();
    await model.dispose();
    await llama.dispose();
}

main().catch((e) => {
    console.error(`peer bench: ${e.message}`);
    process.exit(1);
});
