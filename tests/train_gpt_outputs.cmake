# A --save or --trace that cannot be written fails in one line before the
# first step (not after hours of training), naming the flag and the path.
# Args: TRAIN_GPT (the binary), WORK_DIR.
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
set(model --layers 1 --width 16 --heads 2 --seq 8 --batch 2 --steps 400 --metrics "${WORK_DIR}/m.jsonl")
foreach(case "--save;${WORK_DIR}/no/such/dir/run.st" "--trace;${WORK_DIR}/no/such/dir/trace.json"
             "--save;${WORK_DIR}")
  list(GET case 0 flag)
  list(GET case 1 path)
  file(REMOVE "${WORK_DIR}/m.jsonl")
  execute_process(COMMAND "${TRAIN_GPT}" ${model} ${flag} "${path}" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(rc EQUAL 0)
    message(FATAL_ERROR "train_gpt ${flag} ${path} succeeded:\n${out}")
  endif()
  string(REGEX REPLACE "\n$" "" err "${err}")
  if(err MATCHES "\n" OR NOT err MATCHES "^train_gpt: ${flag} [^\n]+ cannot be written \\(checked before training\\): [^\n]+")
    message(FATAL_ERROR "train_gpt ${flag} ${path}: expected one line naming the flag, got:\n${err}")
  endif()
  if(EXISTS "${WORK_DIR}/m.jsonl" OR out MATCHES "final loss")
    message(FATAL_ERROR "train_gpt ${flag} ${path} trained before failing:\n${out}")
  endif()
  message(STATUS "${err}")
endforeach()
# The probe leaves nothing behind in a directory it can write.
execute_process(COMMAND "${TRAIN_GPT}" ${model} --steps 2 --save "${WORK_DIR}/ok.st" --trace "${WORK_DIR}/t.json"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
file(GLOB temps "${WORK_DIR}/*.tmp-*")
if(NOT rc EQUAL 0 OR temps OR NOT EXISTS "${WORK_DIR}/ok.st" OR NOT EXISTS "${WORK_DIR}/t.json")
  message(FATAL_ERROR "a good --save and --trace: rc ${rc}, temporaries '${temps}':\n${out}\n${err}")
endif()
