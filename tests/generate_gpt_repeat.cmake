# generate_gpt is deterministic in its seed: the same flags twice write the
# same text (greedy, and sampled with temperature, top-k and top-p), and the
# prompts generated one at a time (--max-batch 1, blocks of 5) write what they
# write batched together: a prompt's tokens do not depend on what it runs
# beside; and --tp 2 and 4, --pp 2 (with and without --prefill-tokens) and --tp 2 --pp 2 (rank threads)
# write tp 1's text, and so does the model with pooled blocks (--pool-blocks, staged or read in place). Random weights (from --seed too), a small model.
# (generate_gpt_checkpoint.cmake shows another seed samples other text.)
# Run with -DGENERATE_GPT=<binary>.
set(model --random --layers 2 --width 64 --heads 4 --seq 64 --max-new 40
          --prompt "The cat" --prompt "A much longer prompt," --prompt "x")

include("${CMAKE_CURRENT_LIST_DIR}/generate_gpt_output.cmake")

set(sampled --temperature 0.8 --top-k 40 --top-p 0.95)
generate(greedy_a --greedy)
generate(greedy_b --greedy)
if(NOT greedy_a STREQUAL greedy_b)
  message(FATAL_ERROR "greedy generation differs between two runs:\n${greedy_a}\n---- and ----\n${greedy_b}")
endif()
generate(seed7_a ${sampled} --seed 7)
generate(seed7_b ${sampled} --seed 7)
if(NOT seed7_a STREQUAL seed7_b)
  message(FATAL_ERROR "sampling with seed 7 differs between two runs:\n${seed7_a}\n---- and ----\n${seed7_b}")
endif()
generate(one_at_a_time ${sampled} --seed 7 --max-batch 1 --block-size 5)
if(NOT one_at_a_time STREQUAL seed7_a)
  message(FATAL_ERROR "one prompt at a time in blocks of 5 differs from all three batched:\n${one_at_a_time}\n---- and ----\n${seed7_a}")
endif()
# Tensor-parallel on rank threads (--tp): tp 1's text, greedy and sampled.
generate(tp2 ${sampled} --seed 7 --tp 2)
if(NOT tp2 STREQUAL seed7_a)
  message(FATAL_ERROR "--tp 2 differs from tp 1:\n${tp2}\n---- and ----\n${seed7_a}")
endif()
generate(tp4 --greedy --tp 4 --max-batch 2)
if(NOT tp4 STREQUAL greedy_a)
  message(FATAL_ERROR "--tp 4 --max-batch 2 differs from tp 1:\n${tp4}\n---- and ----\n${greedy_a}")
endif()
# Pipeline-parallel (--pp): two stages of one block each, greedy and sampled, fewer slots than prompts.
generate(pp2 ${sampled} --seed 7 --pp 2)
if(NOT pp2 STREQUAL seed7_a)
  message(FATAL_ERROR "--pp 2 differs from pp 1:\n${pp2}\n---- and ----\n${seed7_a}")
endif()
# A prompt-token budget per step (--prefill-tokens 6): each prompt here is admitted in a step of its own.
generate(pp2_budget ${sampled} --seed 7 --pp 2 --prefill-tokens 6)
if(NOT pp2_budget STREQUAL seed7_a)
  message(FATAL_ERROR "--pp 2 --prefill-tokens 6 differs from pp 1:\n${pp2_budget}\n---- and ----\n${seed7_a}")
endif()
generate(pp2_greedy --greedy --pp 2 --max-batch 2)
if(NOT pp2_greedy STREQUAL greedy_a)
  message(FATAL_ERROR "--pp 2 --max-batch 2 differs from pp 1:\n${pp2_greedy}\n---- and ----\n${greedy_a}")
endif()
# Peer memory pooling (--pool-blocks): both blocks in a host pool, staged one ahead by the copy
# thread; one pooled block read in place.
generate(pooled ${sampled} --seed 7 --pool-blocks 2 --prefetch 1)
if(NOT pooled STREQUAL seed7_a)
  message(FATAL_ERROR "--pool-blocks 2 --prefetch 1 differs from the resident model:\n${pooled}\n---- and ----\n${seed7_a}")
endif()
if(NOT pooled_output MATCHES "pooled \\{0,1\\} in pool.*BlockPrefetcher\\(Prefetch\\(lookahead=1\\)")
  message(FATAL_ERROR "--pool-blocks 2 did not say where the blocks are:\n${pooled_output}")
endif()
generate(pooled_in_place --greedy --pool-blocks 1)
if(NOT pooled_in_place STREQUAL greedy_a)
  message(FATAL_ERROR "--pool-blocks 1 differs from the resident model:\n${pooled_in_place}\n---- and ----\n${greedy_a}")
endif()
# Both (--tp 2 --pp 2): two stages, each cut over 2 rank threads.
generate(tp2_pp2 ${sampled} --seed 7 --tp 2 --pp 2 --max-batch 2)
if(NOT tp2_pp2 STREQUAL seed7_a)
  message(FATAL_ERROR "--tp 2 --pp 2 differs from tp 1:\n${tp2_pp2}\n---- and ----\n${seed7_a}")
endif()
if(NOT pp2_output MATCHES "pipeline-parallel in 2 stages on rank threads")
  message(FATAL_ERROR "--pp 2 did not say it runs in 2 stages:\n${pp2_output}")
endif()
if(NOT tp2_output MATCHES "tensor-parallel on 2 rank threads")
  message(FATAL_ERROR "--tp 2 did not say it runs on 2 rank threads:\n${tp2_output}")
endif()
message(STATUS "greedy twice, seed 7 twice, seed 7 one at a time, --tp 2, --tp 4, --pp 2, --tp 2 --pp 2 and --pool-blocks agree:\n${seed7_a}")
