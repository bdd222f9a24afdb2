# generate_gpt --cape: CaPE's tree verification writes, greedily, exactly the
# target's own greedy text whatever the draft (a smaller random one, which
# the target rejects almost always, so the alternatives are what it accepts
# when anything), with the target as its own draft (every chain token
# accepted: gamma + 1 tokens per target pass), with other --cape-bins, and
# continuously batched (--max-batch 2). Random weights, a small model. Run
# with -DGENERATE_GPT=<binary>.
set(model --random --layers 2 --width 64 --heads 4 --seq 64 --max-new 40 --greedy
          --prompt "The cat" --prompt "A much longer prompt," --prompt "x")
include("${CMAKE_CURRENT_LIST_DIR}/generate_gpt_output.cmake")

generate(plain)
foreach(run
    "small_draft|--draft-random --draft-layers 1 --draft-width 32 --draft-heads 2 --gamma 4 --cape"
    "same_draft|--draft-random --draft-layers 2 --draft-width 64 --draft-heads 4 --gamma 4 --cape"
    "wide_bins|--draft-random --draft-layers 1 --draft-width 32 --draft-heads 2 --gamma 3 --cape --cape-bins 12@0.5,3"
    "two_at_a_time|--draft-random --draft-layers 1 --draft-width 32 --draft-heads 2 --gamma 4 --cape --max-batch 2")
  string(REPLACE "|" ";" parts "${run}")
  list(GET parts 0 name)
  list(GET parts 1 flags)
  separate_arguments(flags)
  generate(${name} ${flags})
  if(NOT ${name} STREQUAL plain)
    message(FATAL_ERROR "greedy CaPE (${name}: ${flags}) differs from plain greedy decoding:\n"
                        "${${name}}\n---- and ----\n${plain}")
  endif()
  if(NOT ${name}_output MATCHES "CaPE: [0-9]+ candidates proposed .chain and alternatives., [0-9]+ accepted")
    message(FATAL_ERROR "no CaPE summary (${name}):\n${${name}_output}")
  endif()
  string(REGEX MATCH "CaPE: [^\n]*" summary "${${name}_output}")
  message(STATUS "${name}: ${summary}")
endforeach()
if(NOT same_draft_output MATCHES "5.00 tokens with the target's own")
  message(FATAL_ERROR "the target as its own draft did not have every chain token accepted:\n${same_draft_output}")
endif()
