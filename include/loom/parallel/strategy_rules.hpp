// The rules a strategy keeps, each one sentence, written once. A C++20
// static_assert takes only a string literal, so each sentence is a macro:
// the policy types and Strategy<...> check it at compile time, and
// StrategySpec::validate and parse_strategy throw the very same sentence at
// run time (tests/parallel/test_strategy_spec.cpp compares the two).
#pragma once

// How policies compose in one Strategy: one of each kind, one compressor per axis.
#define LOOM_RULE_ONE_DATA_PARALLEL \
    "loom::Strategy<...> lists DataParallel twice; give it once, with all its options"
#define LOOM_RULE_ONE_ZERO_STAGE \
    "loom::Strategy<...> lists ZeroShard twice; a model has one ZeRO stage, choose 1, 2 or 3"
#define LOOM_RULE_ONE_TENSOR_POLICY                                                                  \
    "loom::Strategy<...> lists TensorParallel or Optimus2D twice; a model has one tensor-parallel " \
    "axis, cut in 1D (TensorParallel) or 2D (Optimus2D)"
#define LOOM_RULE_ONE_SEQUENCE_POLICY \
    "loom::Strategy<...> lists SequenceParallel twice; a model has one sp axis, with one attention"
#define LOOM_RULE_ONE_PIPELINE \
    "loom::Strategy<...> lists Pipeline twice; a model runs one pipeline schedule, choose one"
#define LOOM_RULE_ONE_RECOMPUTE \
    "loom::Strategy<...> lists Recompute twice; a model has one recomputation policy, Full, Selective or Budget<Bytes>"
#define LOOM_RULE_ONE_COMPRESSOR_PER_AXIS                                                                 \
    "loom::Strategy<...> lists two GradCompress policies for one axis; give each axis (DpAxis, PpAxis, " \
    "TpAxis) at most one compressor"

// What each policy's own arguments must be.
#define LOOM_RULE_BUCKET_BYTES "BucketBytes<N>: a bucket must hold at least 1 byte"
#define LOOM_RULE_ONE_BUCKET_SIZE "DataParallel<Options...>: BucketBytes is given twice; give one bucket size"
#define LOOM_RULE_ZERO_STAGE_RANGE                                                           \
    "ZeroShard<Stage>: Stage must be 1 (optimizer state), 2 (+ gradients) or 3 (+ parameters); " \
    "plain DataParallel<> is stage 0"
#define LOOM_RULE_INTERLEAVED_CHUNKS                                                 \
    "Interleaved<V>: V is the number of chunks per rank and must be at least 2; " \
    "one chunk per rank is OneFOneB"
#define LOOM_RULE_SCHEDULE_CHUNKS \
    "Pipeline<Schedule>: GPipe, 1F1B and ZB-H1 run 1 chunk per rank and ZB-V runs 2; only Interleaved<V> chooses V"
#define LOOM_RULE_RECOMPUTE_BUDGET \
    "Recompute<Budget<Bytes>>: the activation budget per rank must be at least 1 byte"
#define LOOM_RULE_ULYSSES_GROUP "UlyssesRing<K>: K is the Ulysses group size, 2 or more (K = 1 is RingAttention)"
#define LOOM_RULE_ACTIVATION_CAST                                                                        \
    "GradCompress on PpAxis or TpAxis takes CastBf16 or CastFp16: activations cross those axes once, " \
    "with no error feedback to recover what a lossier compressor drops"
