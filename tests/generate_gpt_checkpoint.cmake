# generate_gpt reads a train_gpt --save checkpoint and writes the text
# train_gpt's own --sample wrote from the same weights (gpt::sample re-runs
# the window for every token; generate_gpt runs the KV cache: temperature 1,
# no top-k or top-p, the same seed and prompt, so the same draws); another
# seed writes other text; --tp 2 writes the sample too. Greedy runs on it too, and a checkpoint of another shape is refused by the
# checkpoint's own message. Run with -DTRAIN_GPT=<binary>
# -DGENERATE_GPT=<binary> -DWORK_DIR=<scratch directory>.
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
set(text "the quick brown fox jumps over the lazy dog. ")
string(REPEAT "${text}" 40 corpus)
file(WRITE "${WORK_DIR}/corpus.txt" "${corpus}")
set(prompt "the quick brown ")  # train_gpt --sample prompts with the corpus's first 16 bytes
set(shape --layers 2 --width 32 --heads 2 --seq 32)

execute_process(COMMAND "${TRAIN_GPT}" ${shape} --batch 4 --steps 40 --lr 1e-2 --data "${WORK_DIR}/corpus.txt"
                        --save "${WORK_DIR}/tiny.safetensors" --sample 16
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "train_gpt failed (${rc}):\n${out}\n${err}")
endif()
string(FIND "${out}" "sample:\n" at)
if(at EQUAL -1)
  message(FATAL_ERROR "train_gpt printed no sample:\n${out}")
endif()
math(EXPR at "${at} + 8")
string(SUBSTRING "${out}" ${at} -1 sample)
string(REGEX REPLACE "\n$" "" sample "${sample}")
string(LENGTH "${sample}" length)
if(NOT length EQUAL 32)
  message(FATAL_ERROR "train_gpt's sample is ${length} bytes, not the prompt's 16 and 16 new:\n${sample}")
endif()

execute_process(COMMAND "${GENERATE_GPT}" --checkpoint "${WORK_DIR}/tiny.safetensors" ${shape} --prompt "${prompt}"
                        --max-new 16 --seed 1
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "generate_gpt --checkpoint failed (${rc}):\n${out}\n${err}")
endif()
string(FIND "${out}" "(trained 40 steps)" loaded)
string(FIND "${out}" " ---\n${sample}\n" found)
if(loaded EQUAL -1 OR found EQUAL -1)
  message(FATAL_ERROR "generate_gpt did not write train_gpt's sample '${sample}' from the checkpoint:\n${out}")
endif()

# The same checkpoint cut over 2 tensor-parallel rank threads (each loads its shard of the whole file's
# weights) writes the same sample.
execute_process(COMMAND "${GENERATE_GPT}" --checkpoint "${WORK_DIR}/tiny.safetensors" ${shape} --prompt "${prompt}"
                        --max-new 16 --seed 1 --tp 2
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
string(FIND "${out}" " ---\n${sample}\n" found)
if(NOT rc EQUAL 0 OR found EQUAL -1)
  message(FATAL_ERROR "generate_gpt --tp 2 (${rc}) did not write train_gpt's sample '${sample}' from the checkpoint:\n${out}\n${err}")
endif()

execute_process(COMMAND "${GENERATE_GPT}" --checkpoint "${WORK_DIR}/tiny.safetensors" ${shape} --prompt "${prompt}"
                        --max-new 16 --seed 2
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
string(FIND "${out}" " ---\n${sample}\n" found)
if(NOT rc EQUAL 0 OR NOT found EQUAL -1)
  message(FATAL_ERROR "generate_gpt --seed 2 failed (${rc}) or wrote seed 1's text '${sample}':\n${out}\n${err}")
endif()

execute_process(COMMAND "${GENERATE_GPT}" --checkpoint "${WORK_DIR}/tiny.safetensors" ${shape} --prompt "${prompt}"
                        --prompt "lazy" --max-new 12 --greedy
                RESULT_VARIABLE rc OUTPUT_VARIABLE greedy ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT greedy MATCHES "--- completion 2: [0-9]+ new tokens[^\n]*\nlazy")
  message(FATAL_ERROR "generate_gpt --greedy from the checkpoint failed (${rc}):\n${greedy}\n${err}")
endif()

execute_process(COMMAND "${GENERATE_GPT}" --checkpoint "${WORK_DIR}/tiny.safetensors" --layers 2 --heads 2 --seq 32
                        --max-new 4
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(expect "was trained with width 32 but this model has width 256")
string(FIND "${err}" "${expect}" named)
if(NOT rc EQUAL 1 OR named EQUAL -1)
  message(FATAL_ERROR "a checkpoint of width 32 read with --width 256: exit ${rc}, not 1 with '${expect}':\n${err}")
endif()
message(STATUS "generate_gpt wrote train_gpt's sample from the checkpoint: ${sample}\n${greedy}")
