# Hearth build.  `make` builds build/bin/hearth-train (and build/bin/hearth once
# the orchestrator exists); `make test` runs every test; `make SAN=1 test-unit`
# runs the unit tests under ASan+UBSan in build-san/.
#
# Sources are discovered by directory so that adding a file needs no edit here:
#   kernels/cpu/*.c       -> libhearth_kernels.a      (plain C fp32 reference)
#   kernels/cuda/*.cu     -> libhearth_kernels_cuda.a (only where nvcc exists)
#   trainer/shape/*.c     -> libhearth_shape.a        (pure model-shape/layout rules)
#   trainer/model/*.c     -> libhearth_model.a        (model forward/backward)
#   trainer/comm/*.c      -> libhearth_comm.a         (communicator: collectives over groups)
#   trainer/*.c           -> libhearth_train.a, except trainer/main.c
#   trainer/prep/*.c      -> libhearth_prep.a, except trainer/prep/main.c (build/bin/hearth-prep)
#   orchestrator/*.c      -> libhearth_orch.a, except orchestrator/main.c (build/bin/hearth)
#   tests/unit/test_*.c   -> build/tests/test_*       (cmocka; helpers in tests/unit/support/)

CC      ?= gcc
NVCC    ?= $(shell command -v nvcc 2>/dev/null)
SAN     ?= 0
BUILD   := $(if $(filter 1,$(SAN)),build-san,build)

CSTD     = -std=c11 -D_GNU_SOURCE
WARN     = -Wall -Wextra -Werror
OPT      = -O2 -g
comma    := ,
SANFLAGS = $(if $(filter 1,$(SAN)),-fsanitize=address$(comma)undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined,)
CFLAGS  += $(CSTD) $(WARN) $(OPT) -fopenmp $(SANFLAGS) -MMD -MP \
           $(patsubst -I%,-isystem %,$(shell pkg-config --cflags-only-I pmix 2>/dev/null))
LDFLAGS += -fopenmp $(SANFLAGS)
TRAIN_LDLIBS = -lyaml -ljansson -lcrypto -lm -lpthread $(or $(shell pkg-config --libs pmix 2>/dev/null),-lpmix)
ORCH_LDLIBS  = -lsqlite3 -lcurl $(TRAIN_LDLIBS)

NVCCFLAGS = -O2 -std=c++17 -MMD -MP \
            -gencode arch=compute_90a,code=sm_90a -gencode arch=compute_90,code=sm_90 \
            -Xcompiler -Wall,-Wextra,-Werror,-fPIC

KERNEL_SRC := $(wildcard kernels/*.c kernels/cpu/*.c)
CUDA_SRC   := $(wildcard kernels/cuda/*.cu)
SHAPE_SRC  := $(wildcard trainer/shape/*.c)
MODEL_SRC  := $(wildcard trainer/model/*.c)
COMM_SRC   := $(wildcard trainer/comm/*.c)
TRAIN_SRC  := $(filter-out trainer/main.c,$(wildcard trainer/*.c)) $(wildcard trainer/parallel/*.c)
PREP_SRC   := $(filter-out trainer/prep/main.c,$(wildcard trainer/prep/*.c))
ORCH_SRC   := $(filter-out orchestrator/main.c,$(wildcard orchestrator/*.c))
TEST_SUPPORT_SRC := $(wildcard tests/unit/support/*.c)
TEST_SRC   := $(wildcard tests/unit/test_*.c)
BENCH_SRC  := $(wildcard contrib/bench/*.c)
CLI_TESTS  := $(filter-out tests/cli/lib.sh,$(wildcard tests/cli/*.sh))

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))

LIB_KERNELS := $(BUILD)/lib/libhearth_kernels.a
LIB_SHAPE   := $(BUILD)/lib/libhearth_shape.a
LIB_MODEL   := $(BUILD)/lib/libhearth_model.a
LIB_TRAIN   := $(BUILD)/lib/libhearth_train.a
LIB_COMM    := $(BUILD)/lib/libhearth_comm.a
LIB_ORCH    := $(BUILD)/lib/libhearth_orch.a
LIB_PREP    := $(BUILD)/lib/libhearth_prep.a
LIB_CUDA    := $(BUILD)/lib/libhearth_kernels_cuda.a
# The cuda device backend (kernels/cuda/kdev_cuda*.cu with the kcuda kernels under it), a
# shared library that kernels/kdev.c loads with dlopen (kdev_backend.h says why).
LIB_CUDA_SO := $(BUILD)/lib/libhearth_cuda.so
# Link order: dependents first.
TRAIN_LIBS := $(LIB_TRAIN) $(LIB_MODEL) $(LIB_COMM) $(LIB_SHAPE) $(LIB_KERNELS)
TEST_LIBS  := $(LIB_ORCH) $(LIB_PREP) $(TRAIN_LIBS)
# Image decoding: only hearth-prep and the tests link it.
PREP_LDLIBS = -lpng -ljpeg

TRAIN_BIN  := $(BUILD)/bin/hearth-train
ORCH_BIN   := $(BUILD)/bin/hearth
PREP_BIN   := $(BUILD)/bin/hearth-prep
TEST_BINS  := $(patsubst tests/unit/%.c,$(BUILD)/tests/%,$(TEST_SRC))
BENCH_BINS := $(patsubst contrib/bench/%.c,$(BUILD)/bench/%,$(BENCH_SRC))

# GPU test and benchmark programs (tests/gpu, contrib/bench/*.cu): plain TAP/table
# printers linked with nvcc against the kernel libraries only (no libyaml or cmocka, which
# the GPU machine lacks).  Without a device the test prints one skipped case.
GPU_TEST_BINS  := $(patsubst tests/gpu/%.cu,$(BUILD)/tests/gpu/%,$(wildcard tests/gpu/test_*.cu))
GPU_BENCH_BINS := $(patsubst contrib/bench/%.cu,$(BUILD)/bench/%,$(wildcard contrib/bench/*.cu))
CUDA_LDLIBS    = -lcublasLt -lgomp -lm
GPU_BINS      :=

ALL := $(TRAIN_BIN) $(PREP_BIN) $(if $(wildcard orchestrator/main.c),$(ORCH_BIN))
ifneq ($(NVCC),)
ifneq ($(CUDA_SRC),)
ALL += $(LIB_CUDA) $(LIB_CUDA_SO)
# Not under SAN=1: nvcc links without the sanitizer runtime that libhearth_kernels.a
# then needs (and ASan under CUDA needs its own settings).
ifneq ($(SAN),1)
GPU_BINS := $(GPU_TEST_BINS) $(GPU_BENCH_BINS)
endif
endif
endif

# Keep object files of tests and benches (make would delete them as intermediates, and
# its `rm` line would follow the test summary).
.SECONDARY:

.PHONY: FORCE all test test-unit test-full test-san bench deps install clean cuda gpu-tests
all: $(ALL)

# Include paths per layer, so that a forbidden include fails to compile.  Bottom up:
#   kernels        kernels/ only (the device interface, its backends, the error codes);
#   shape          kernels + trainer/shape (model-shape rules, the error type, the build's
#                  version, the bounded file reader: what every program shares);
#   comm, model    kernels + shape (+ comm) (+ model);
#   trainer        kernels + all of trainer/ (trainer/*.c, parallel/, prep/);
#   orchestrator   kernels + shape + orchestrator/: never the trainer's model or run code.
# A view is a directory of symlinks, $(BUILD)/inc/VIEW/MODULE -> trainer/MODULE, so that
# "shape/x.h" resolves and "model/x.h" does not.  Tests, benchmarks and tools see all.
INC = -I. -Ikernels -Itrainer -Iorchestrator
$(BUILD)/obj/kernels/%.o:       INC = -Ikernels
$(BUILD)/obj/trainer/%.o:       INC = -Ikernels -Itrainer
$(BUILD)/obj/trainer/shape/%.o: INC = -Ikernels -I$(BUILD)/inc/shape
$(BUILD)/obj/trainer/comm/%.o:  INC = -Ikernels -I$(BUILD)/inc/comm
$(BUILD)/obj/trainer/model/%.o: INC = -Ikernels -I$(BUILD)/inc/model
$(BUILD)/obj/orchestrator/%.o:  INC = -Ikernels -Iorchestrator -I$(BUILD)/inc/shape
NVINC = -I. -Ikernels
$(BUILD)/obj/kernels/%.o:       NVINC = -Ikernels
INC_VIEWS := $(addprefix $(BUILD)/inc/,shape/shape comm/shape comm/comm model/shape \
                                       model/comm model/model)
$(INC_VIEWS):
	@mkdir -p $(dir $@)
	ln -sfn $(CURDIR)/trainer/$(notdir $@) $@

$(BUILD)/obj/%.o: %.c | $(INC_VIEWS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(INC) -c $< -o $@

$(BUILD)/obj/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) $(NVINC) -c $< -o $@

define archive
	@mkdir -p $(dir $@)
	@rm -f $@
	ar rcs $@ $^
endef

$(LIB_KERNELS): $(call obj,$(KERNEL_SRC)) ; $(archive)
$(LIB_SHAPE):   $(call obj,$(SHAPE_SRC))  ; $(archive)
$(LIB_MODEL):   $(call obj,$(MODEL_SRC))  ; $(archive)
$(LIB_TRAIN):   $(call obj,$(TRAIN_SRC))  ; $(archive)
$(LIB_COMM):    $(call obj,$(COMM_SRC))   ; $(archive)
$(LIB_ORCH):    $(call obj,$(ORCH_SRC))   ; $(archive)
$(LIB_PREP):    $(call obj,$(PREP_SRC))   ; $(archive)
$(LIB_CUDA):    $(patsubst %.cu,$(BUILD)/obj/%.o,$(CUDA_SRC)) ; $(archive)

# Every kernels/cuda object (hence -fPIC in NVCCFLAGS), cudart linked statically (nvcc's
# default) and cuBLASLt dynamically.  The version script exports only the backend's entry
# point, so that the kcuda_ and CUDA runtime symbols inside never meet a program's own.
# -z nodelete: dlclose (kdev_free) leaves it loaded, so the CUDA runtime inside is never
# torn down under a live process nor started twice.
$(LIB_CUDA_SO): $(patsubst %.cu,$(BUILD)/obj/%.o,$(CUDA_SRC)) kernels/cuda/libhearth_cuda.map
	@mkdir -p $(dir $@)
	$(NVCC) -shared $(filter %.o,$^) -o $@ \
	    -Xlinker --version-script=kernels/cuda/libhearth_cuda.map -Xlinker -z,nodelete \
	    -lcublasLt

$(TRAIN_BIN): $(call obj,trainer/main.c) $(TRAIN_LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(TRAIN_LDLIBS)

$(PREP_BIN): $(call obj,trainer/prep/main.c) $(LIB_PREP) $(TRAIN_LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(PREP_LDLIBS) $(TRAIN_LDLIBS)

# The orchestrator links only the pure shape/rules module of the trainer (DESIGN.md),
# which also holds the build's version (trainer/shape/version.c).
$(ORCH_BIN): $(call obj,orchestrator/main.c) $(LIB_ORCH) $(LIB_SHAPE)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(ORCH_LDLIBS)

$(BUILD)/tests/%: $(BUILD)/obj/tests/unit/%.o $(call obj,$(TEST_SUPPORT_SRC)) $(TEST_LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(ORCH_LDLIBS) $(PREP_LDLIBS) -lcmocka
# Allocation-failure injection (tests/unit/test_orch_oom.c): the allocators of every hearth
# object in the program go through the test's counting wrappers.
$(BUILD)/tests/test_orch_oom: LDFLAGS += $(foreach f,malloc calloc realloc strdup strndup asprintf vasprintf,-Wl,--wrap=$(f))

$(BUILD)/bench/%: $(BUILD)/obj/contrib/bench/%.o $(call obj,$(TEST_SUPPORT_SRC)) $(TEST_LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(ORCH_LDLIBS)

# `git describe` baked into version.o; the stamp file only changes when the description
# does, so an unchanged tree does not relink.
GIT_DESCRIBE := $(shell git describe --always --dirty 2>/dev/null)
$(BUILD)/version.stamp: FORCE
	@mkdir -p $(dir $@)
	@echo '$(GIT_DESCRIBE)' | cmp -s - $@ || echo '$(GIT_DESCRIBE)' > $@
$(BUILD)/obj/trainer/shape/version.o: $(BUILD)/version.stamp
$(BUILD)/obj/trainer/shape/version.o: CFLAGS += -DHEARTH_GIT_DESCRIBE='"$(GIT_DESCRIBE)"'
FORCE:

# The schema is compiled into hearth: db/migrations/*.sql -> orchestrator/db_migrations.c
# (checked in; test_orch_db fails when the two differ).
orchestrator/db_migrations.c: db/gen_migrations.sh $(wildcard db/migrations/*.sql)
	db/gen_migrations.sh db/migrations > $@.tmp && mv $@.tmp $@

cuda: $(if $(CUDA_SRC),$(LIB_CUDA) $(LIB_CUDA_SO))

# The kdev test (tests/gpu/test_kdev_gpu.cu) loads the backend library at run time.
gpu-tests: $(GPU_BINS) $(if $(GPU_BINS),$(LIB_CUDA_SO))

$(GPU_TEST_BINS): $(BUILD)/tests/gpu/%: $(BUILD)/obj/tests/gpu/%.o $(LIB_CUDA) $(LIB_KERNELS)
	@mkdir -p $(dir $@)
	$(NVCC) $^ -o $@ $(CUDA_LDLIBS)

$(BUILD)/tests/gpu/test_kdev_gpu: | $(LIB_CUDA_SO)

$(GPU_BENCH_BINS): $(BUILD)/bench/%: $(BUILD)/obj/contrib/bench/%.o $(LIB_CUDA) $(LIB_KERNELS)
	@mkdir -p $(dir $@)
	$(NVCC) $^ -o $@ $(CUDA_LDLIBS)

# The shape module without the files that need libyaml or jansson headers (the GPU
# machine has neither): what GPU test programs that need the shape rules link.
SHAPE_CORE_SRC := $(filter-out $(shell grep -lE '<(yaml|jansson)\.h>|canon_json\.h' $(SHAPE_SRC) 2>/dev/null),$(SHAPE_SRC))
LIB_SHAPE_CORE := $(BUILD)/lib/libhearth_shape_core.a
$(LIB_SHAPE_CORE): $(call obj,$(SHAPE_CORE_SRC)) ; $(archive)

# The nccl communicator (trainer/comm/*.cu -> libhearth_comm_nccl.a), built only with nvcc
# and linked only by its own test: never part of libhearth_comm.a or hearth-train, so that
# a machine without libnccl runs the CPU trainer.  Where nccl.h is missing the test is
# built as a skip.
NCCL_H := $(firstword $(wildcard $(dir $(NVCC))../include/nccl.h /usr/local/cuda/include/nccl.h /usr/include/nccl.h))
COMM_NCCL_SRC := $(wildcard trainer/comm/*.cu)
LIB_COMM_NCCL := $(BUILD)/lib/libhearth_comm_nccl.a
$(LIB_COMM_NCCL): $(patsubst %.cu,$(BUILD)/obj/%.o,$(COMM_NCCL_SRC)) ; $(archive)
$(BUILD)/obj/trainer/comm/comm_nccl.o $(BUILD)/obj/tests/gpu/test_comm_nccl_gpu.o: NVCCFLAGS += -Itrainer
ifneq ($(NCCL_H),)
$(BUILD)/tests/gpu/test_comm_nccl_gpu: $(LIB_COMM_NCCL) $(LIB_COMM) $(LIB_SHAPE_CORE)
$(BUILD)/tests/gpu/test_comm_nccl_gpu: CUDA_LDLIBS = $(LIB_COMM_NCCL) $(LIB_COMM) $(LIB_SHAPE_CORE) \
	-lnccl -lgomp -lm -lpthread
else
$(BUILD)/obj/tests/gpu/test_comm_nccl_gpu.o: NVCCFLAGS += -DHEARTH_NO_NCCL
endif

# Every test: unit binaries and CLI scripts, one summary line at the end.
# The Slurm tests (tests/cli/hearth_slurm_*.sh) need a cluster: `test` starts a throw-away
# one (contrib/slurm-local, root needed) before the tests and stops it after, whatever
# happened.  Its own directory and ports, so that it never touches a cluster of the user's.
SLURM_TEST_DIR ?= /tmp/hearth-slurm-test
SLURM_TEST_PORT ?= 16917
# slurmrestd (JWT) of that instance, for tests/cli/hearth_slurmrest.sh.
SLURM_TEST_REST_PORT ?= 16916
SLURM_TEST_ENV = HEARTH_SLURM_DIR=$(SLURM_TEST_DIR) HEARTH_SLURM_PORT_BASE=$(SLURM_TEST_PORT) \
	HEARTH_SLURM_NODES=2 HEARTH_SLURM_CPUS=2 HEARTH_SLURM_MAX_ARRAY_SIZE=5 \
	HEARTH_SLURM_REST_PORT=$(SLURM_TEST_REST_PORT) \
	SLURM_CONF=$(SLURM_TEST_DIR)/slurm.conf
# A second instance that keeps accounting (slurmdbd + MariaDB: start.sh --with-dbd), for
# tests/cli/hearth_slurm_dbd.sh and hearth_slurm_nodekill.sh; the latter kills one of its
# slurmd, which slurmctld notices after the short SlurmdTimeout set here.
SLURM_DBD_TEST_DIR ?= /tmp/hearth-slurm-dbd-test
SLURM_DBD_TEST_PORT ?= 16927
SLURM_DBD_TEST_ENV = HEARTH_SLURM_DIR=$(SLURM_DBD_TEST_DIR) HEARTH_SLURM_PORT_BASE=$(SLURM_DBD_TEST_PORT) \
	HEARTH_SLURM_NODES=2 HEARTH_SLURM_CPUS=2 HEARTH_SLURM_SLURMD_TIMEOUT=6 HEARTH_SLURM_DBD=1 \
	HEARTH_SLURM_REST_PORT= SLURM_CONF=$(SLURM_DBD_TEST_DIR)/slurm.conf
test: all $(TEST_BINS) $(GPU_BINS)
	@$(SLURM_TEST_ENV) contrib/slurm-local/start.sh || \
	    echo "make test: the test Slurm cluster did not start: the Slurm tests will fail"; \
	$(SLURM_DBD_TEST_ENV) contrib/slurm-local/start.sh || \
	    echo "make test: the accounting test Slurm cluster did not start: its tests will fail"; \
	$(SLURM_TEST_ENV) HEARTH_SLURM_DBD_DIR=$(SLURM_DBD_TEST_DIR) BUILD=$(BUILD) \
	    tests/run.sh $(TEST_BINS) $(filter $(GPU_TEST_BINS),$(GPU_BINS)) $(CLI_TESTS); rc=$$?; \
	$(SLURM_TEST_ENV) contrib/slurm-local/stop.sh >/dev/null 2>&1 & \
	$(SLURM_DBD_TEST_ENV) contrib/slurm-local/stop.sh >/dev/null 2>&1; wait; exit $$rc

test-unit: $(TEST_BINS)
	@BUILD=$(BUILD) tests/run.sh $(TEST_BINS)

# Every valid combination of the layout space of tests/unit/test_ptrain.c against the
# single-rank run (about 6,000 layouts: hours on 2 cores; `make test` runs an all-pairs
# cover of the same space plus named corner cases).
test-full: $(BUILD)/tests/test_ptrain
	HEARTH_TEST_FULL=1 $(BUILD)/tests/test_ptrain

# Unit tests under AddressSanitizer + UndefinedBehaviorSanitizer.
test-san:
	$(MAKE) SAN=1 test-unit

# Fuzz targets (tests/fuzz/fuzz_*.c, libFuzzer through clang + libclang-rt; docs/fuzzing.md):
# built with ASan + UBSan (UB aborts) into build-fuzz/, linked against only the parsers
# they exercise.  `make fuzz` builds them; `make fuzz-smoke` runs each for FUZZ_SECONDS on
# a copy of its seed corpus (tests/fuzz/corpus/NAME/), FUZZ_JOBS (2) at a time, and fails on
# any crash, leak or UB.
FUZZ_CC      ?= clang-14
FUZZ_SECONDS ?= 60
FUZZ_DIR     := build-fuzz
FUZZ_SAN      = -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
FUZZ_CFLAGS   = $(CSTD) $(WARN) -O1 -g $(FUZZ_SAN) -fsanitize=fuzzer-no-link -MMD -MP \
                -I. -Ikernels -Itrainer -Iorchestrator
FUZZ_SRC     := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_BINS    := $(patsubst tests/fuzz/%.c,$(FUZZ_DIR)/bin/%,$(FUZZ_SRC))
# The trainer files the readers need (not the whole trainer library).
FUZZ_TRAIN_SRC := kernels/cpu/bf16.c trainer/safetensors.c trainer/safetensors_dtype.c trainer/safetensors_set.c trainer/safetensors_write.c trainer/shard_format.c trainer/outputs.c trainer/shape/version.c
FUZZ_LIB     := $(FUZZ_DIR)/lib/libhearth_fuzz.a
fuzz_obj      = $(patsubst %.c,$(FUZZ_DIR)/obj/%.o,$(1))
.PHONY: fuzz fuzz-smoke
fuzz: $(FUZZ_BINS)
$(FUZZ_DIR)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -c $< -o $@
$(FUZZ_LIB): $(call fuzz_obj,$(ORCH_SRC) $(SHAPE_SRC) $(FUZZ_TRAIN_SRC)) ; $(archive)
# In bin/, so that the preset search beside the binary (../../contrib/models) finds the
# repository's presets.
$(FUZZ_DIR)/bin/%: $(FUZZ_DIR)/obj/tests/fuzz/%.o $(FUZZ_LIB)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_SAN) -fsanitize=fuzzer $^ -o $@ $(ORCH_LDLIBS)
fuzz-smoke: $(FUZZ_BINS)
	tests/fuzz/smoke.sh $(FUZZ_DIR) $(FUZZ_SECONDS) $(notdir $(FUZZ_BINS))
-include $(shell find $(FUZZ_DIR)/obj -name '*.d' 2>/dev/null)

bench: all $(BENCH_BINS)
	@contrib/bench/run.sh $(BUILD)

deps:
	contrib/install-deps.sh

# Installs the two programs with what they look up beside themselves
# (PREFIX/share/hearth: model presets, job-script templates, schema migrations for reference).
PREFIX ?= /usr/local
install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/hearth/models \
	    $(DESTDIR)$(PREFIX)/share/hearth/templates $(DESTDIR)$(PREFIX)/share/hearth/migrations
	install -m 755 $(TRAIN_BIN) $(ORCH_BIN) $(PREP_BIN) $(DESTDIR)$(PREFIX)/bin/
	@# The cuda device backend, where nvcc built it: kdev_create finds it in ../lib beside
	@# the program (docs/device.md).
	if [ -f $(LIB_CUDA_SO) ]; then install -d $(DESTDIR)$(PREFIX)/lib && \
	    install -m 755 $(LIB_CUDA_SO) $(DESTDIR)$(PREFIX)/lib/; fi
	install -m 644 contrib/models/*.yaml $(DESTDIR)$(PREFIX)/share/hearth/models/
	install -m 644 templates/*.tmpl $(DESTDIR)$(PREFIX)/share/hearth/templates/
	install -m 644 db/migrations/*.sql $(DESTDIR)$(PREFIX)/share/hearth/migrations/
	@# Manual pages and shell completion, generated from the tables the programs use.
	install -d $(DESTDIR)$(PREFIX)/share/man/man1 $(DESTDIR)$(PREFIX)/share/man/man5 \
	    $(DESTDIR)$(PREFIX)/share/bash-completion/completions \
	    $(DESTDIR)$(PREFIX)/share/zsh/site-functions
	$(ORCH_BIN) man hearth >$(DESTDIR)$(PREFIX)/share/man/man1/hearth.1
	$(ORCH_BIN) man hearth-train --trainer $(TRAIN_BIN) >$(DESTDIR)$(PREFIX)/share/man/man1/hearth-train.1
	$(ORCH_BIN) man hearth-spec >$(DESTDIR)$(PREFIX)/share/man/man5/hearth-spec.5
	$(ORCH_BIN) completion bash >$(DESTDIR)$(PREFIX)/share/bash-completion/completions/hearth
	$(ORCH_BIN) completion zsh >$(DESTDIR)$(PREFIX)/share/zsh/site-functions/_hearth

# The README's first command: installs the Debian packages that are missing, builds, sweeps
# contrib/examples/demo.yaml (learning rate x seed) and demo-layouts.yaml (tp x pp x encoder
# strategy on 4 ranks) through the local backend (2 jobs at once) into a database of its
# own, and prints the best runs of each: the learning rates by final loss (what a learning
# rate changes), the layouts by tokens/s (they train the same model to the same loss).
# It ends by saying where the database is and what to run next, since the database is not
# the default ./hearth.db.  Running it again reruns nothing (completed points are skipped)
# and prints the tables again.
DEMO_DIR ?= $(BUILD)/demo
.PHONY: demo
demo:
	contrib/install-deps.sh
	$(MAKE) all
	@mkdir -p $(DEMO_DIR)
	@status=0; \
	for spec in demo:final_loss demo-layouts:tokens_per_s; do \
	    $(ORCH_BIN) submit contrib/examples/$${spec%%:*}.yaml --backend local --jobs 2 \
	        --db $(DEMO_DIR)/hearth.db --runs-dir $(DEMO_DIR)/runs || status=$$?; \
	    $(ORCH_BIN) top $${spec%%:*} --by $${spec##*:} --db $(DEMO_DIR)/hearth.db || status=$$?; \
	done; \
	echo; \
	echo "results in $(DEMO_DIR)/hearth.db (runs in $(DEMO_DIR)/runs); try:"; \
	echo "  export HEARTH_DB=$(DEMO_DIR)/hearth.db    # or --db $(DEMO_DIR)/hearth.db on each command"; \
	echo "  $(ORCH_BIN) status demo"; \
	echo "  $(ORCH_BIN) top demo --by final_loss"; \
	echo "  $(ORCH_BIN) show demo-1"; \
	echo "  $(ORCH_BIN) report demo --html demo.html"; \
	exit $$status

clean:
	rm -rf build build-san build-fuzz

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
