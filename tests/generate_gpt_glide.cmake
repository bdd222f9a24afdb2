# generate_gpt --glide: speculative decoding with a GliDe draft (its
# cross-attention reads the target's KV cache) writes, greedily, exactly the
# target's own greedy text: with vanilla rounds, with CaPE, and continuously
# batched one prompt at a time. Random weights, a small model. Run with
# -DGENERATE_GPT=<binary>.
set(model --random --layers 2 --width 64 --heads 4 --seq 64 --max-new 40 --greedy
          --prompt "The cat" --prompt "A much longer prompt," --prompt "x")
include("${CMAKE_CURRENT_LIST_DIR}/generate_gpt_output.cmake")

generate(plain)
foreach(run "glide|--gamma;3" "glide_cape|--gamma;4;--cape" "glide_one_at_a_time|--gamma;2;--max-batch;1"
            "glide_two_layers|--gamma;3;--draft-layers;2")
  string(REPLACE "|" ";" parts "${run}")
  list(GET parts 0 name)
  list(SUBLIST parts 1 -1 flags)
  generate(${name} --draft-random --draft-layers 1 --draft-width 32 --draft-heads 2 --glide ${flags})
  if(NOT ${name} STREQUAL plain)
    message(FATAL_ERROR "greedy GliDe decoding (${flags}) differs from plain greedy decoding:\n"
                        "${${name}}\n---- and ----\n${plain}")
  endif()
  if(NOT ${name}_output MATCHES "draft: GliDe GPT\\(layers=[12], width=32" OR
     NOT ${name}_output MATCHES "speculative: gamma [234]; [0-9]+ target passes")
    message(FATAL_ERROR "no GliDe draft line or speculative summary (${flags}):\n${${name}_output}")
  endif()
endforeach()
string(REGEX MATCH "speculative: [^\n]*" summary "${glide_output}")
message(STATUS "greedy with a random GliDe draft (vanilla, CaPE, --max-batch 1, 2 draft layers) equals plain "
               "greedy:\n${summary}")
