# generate_gpt --draft: speculative decoding writes, greedily, exactly the
# target's own greedy text whatever the draft (here a smaller random one,
# which the target rejects almost always), and a draft that is the target
# (same shape, same seed) has every proposal accepted: gamma + 1 tokens per
# target pass; with --max-batch (fewer slots than prompts) the same text.
# Random weights, a small model. Run with -DGENERATE_GPT=<binary>.
set(model --random --layers 2 --width 64 --heads 4 --seq 64 --max-new 40 --greedy
          --prompt "The cat" --prompt "A much longer prompt," --prompt "x")
include("${CMAKE_CURRENT_LIST_DIR}/generate_gpt_output.cmake")

generate(plain)
generate(small_draft --draft-random --draft-layers 1 --draft-width 32 --draft-heads 2 --gamma 3)
if(NOT small_draft STREQUAL plain)
  message(FATAL_ERROR "greedy speculative decoding with a small draft differs from plain greedy decoding:\n"
                      "${small_draft}\n---- and ----\n${plain}")
endif()
if(NOT small_draft_output MATCHES "speculative: gamma 3; [0-9]+ target passes")
  message(FATAL_ERROR "no speculative summary:\n${small_draft_output}")
endif()
generate(same_draft --draft-random --draft-layers 2 --draft-width 64 --draft-heads 4 --gamma 4)
if(NOT same_draft STREQUAL plain)
  message(FATAL_ERROR "greedy speculative decoding with the target as its draft differs from plain greedy decoding:\n"
                      "${same_draft}\n---- and ----\n${plain}")
endif()
if(NOT same_draft_output MATCHES "accepted \\(100%\\); 5.00 tokens per target pass")
  message(FATAL_ERROR "the target as its own draft did not have every proposal accepted:\n${same_draft_output}")
endif()
# Continuously batched: one prompt at a time (each finished prompt's slot
# taken by the next at the next round), and two at a time, the same text.
generate(one_at_a_time --draft-random --draft-layers 1 --draft-width 32 --draft-heads 2 --gamma 3 --max-batch 1)
if(NOT one_at_a_time STREQUAL plain)
  message(FATAL_ERROR "greedy speculative decoding with --max-batch 1 differs from plain greedy decoding:\n"
                      "${one_at_a_time}\n---- and ----\n${plain}")
endif()
if(NOT one_at_a_time_output MATCHES "up to 1 at once")
  message(FATAL_ERROR "--max-batch 1 did not run one prompt at a time:\n${one_at_a_time_output}")
endif()
generate(two_at_a_time --draft-random --draft-layers 2 --draft-width 64 --draft-heads 4 --gamma 4 --max-batch 2)
if(NOT two_at_a_time STREQUAL plain)
  message(FATAL_ERROR "greedy speculative decoding with --max-batch 2 differs from plain greedy decoding:\n"
                      "${two_at_a_time}\n---- and ----\n${plain}")
endif()
string(REGEX MATCH "speculative: [^\n]*" small_summary "${small_draft_output}")
string(REGEX MATCH "speculative: [^\n]*" same_summary "${same_draft_output}")
message(STATUS "greedy with a small draft and with the target as draft, all at once and with --max-batch 1 and 2, "
               "equal plain greedy:\n"
               "${small_summary}\n${same_summary}")
