# Compile-failure tests: each source must NOT compile, and the compiler's
# output must contain loom's sentence (so a failure for another reason, or a
# success, fails the test).
#   loom_compile_fail(<name> <source> <regex>)
function(loom_compile_fail name source regex)
  string(MAKE_C_IDENTIFIER "compile_fail_${name}" target)
  add_library(${target} OBJECT EXCLUDE_FROM_ALL "${CMAKE_CURRENT_SOURCE_DIR}/compile_fail/${source}")
  target_link_libraries(${target} PRIVATE loom::loom)
  add_test(NAME "compile-fail: ${name}"
           COMMAND "${CMAKE_COMMAND}" --build "${CMAKE_BINARY_DIR}" --target ${target})
  set_tests_properties("compile-fail: ${name}" PROPERTIES
    WILL_FAIL FALSE
    PASS_REGULAR_EXPRESSION "${regex}"
    RESOURCE_LOCK ${LOOM_BUILD_TREE_LOCK})
endfunction()

set(loom_reflect_sentence "loom cannot reflect this layer type")
loom_compile_fail("reflecting a layer with a base class" reflect_base_class.cpp "${loom_reflect_sentence}")
loom_compile_fail("reflecting a layer with a user constructor" reflect_user_constructor.cpp "${loom_reflect_sentence}")
loom_compile_fail("reflecting a layer with virtual functions" reflect_virtual.cpp "${loom_reflect_sentence}")
loom_compile_fail("dtype_of an unsupported element type" dtype_of_unsupported.cpp "dtype_of<T> is only defined for float, loom::bf16, loom::f16")
loom_compile_fail("Strategy lists DataParallel twice" strategy_data_parallel_twice.cpp "lists DataParallel twice")
loom_compile_fail("Strategy lists ZeroShard twice" strategy_zero_shard_twice.cpp "lists ZeroShard twice")
loom_compile_fail("Strategy lists Recompute twice" strategy_recompute_twice.cpp "lists Recompute twice")
loom_compile_fail("ZeroShard stage 4" strategy_zero_stage_4.cpp "Stage must be 1")
loom_compile_fail("Strategy of something that is not a policy" strategy_not_a_policy.cpp "every argument must be a policy")
loom_compile_fail("DataParallel with an option that is not one" strategy_bad_data_parallel_option.cpp "every option must be a DataParallel option")
loom_compile_fail("TopK with a ratio of 0" compress_top_k_ratio_zero.cpp "TopK<ratio>: the ratio is the fraction of each chunk sent")
loom_compile_fail("a lossy compressor on the pipeline axis" compress_lossy_on_pipeline.cpp "GradCompress on PpAxis or TpAxis takes CastBf16 or CastFp16")
loom_compile_fail("two compressors for one axis" compress_twice_on_one_axis.cpp "lists two GradCompress policies for one axis")
loom_compile_fail("GradCompress of something that is not a compressor" compress_not_a_compressor.cpp "the compressor must be CastBf16, CastFp16")
loom_compile_fail("a custom policy that does not lower itself" strategy_custom_policy_without_lower.cpp "a policy of kind custom must lower itself")
