# --resume with another --data or --seed would not continue the same run:
# refused in one line naming both values, unless --resume-anyway.
# Args: TRAIN_GPT (the binary), WORK_DIR.
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
string(REPEAT "the quick brown fox jumps over the lazy dog. " 40 text_a)
string(REPEAT "pack my box with five dozen liquor jugs. " 40 text_b)
file(WRITE "${WORK_DIR}/a.txt" "${text_a}")
file(WRITE "${WORK_DIR}/b.txt" "${text_b}")
set(model --layers 1 --width 16 --heads 2 --seq 8 --batch 2 --steps 6)
set(ckpt "${WORK_DIR}/a.st")
include("${CMAKE_CURRENT_LIST_DIR}/train_gpt_run.cmake")
run(--data "${WORK_DIR}/a.txt" --seed 4 --until 2 --save "${ckpt}")

function(refused expect)
  execute_process(COMMAND "${TRAIN_GPT}" ${model} --resume "${ckpt}" ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err)
  string(REGEX REPLACE "\n$" "" err "${err}")
  if(rc EQUAL 0 OR NOT err MATCHES "^train_gpt: checkpoint [^\n]*a.st ${expect}; resuming would not continue the same run \\(give the same settings, or --resume-anyway to continue anyway\\)( \\[[^]]+\\])?$")
    message(FATAL_ERROR "--resume ${ARGN}: expected a refusal matching '${expect}' (rc ${rc}):\n${out}\n${err}")
  endif()
  if(out MATCHES "final loss")
    message(FATAL_ERROR "--resume ${ARGN} trained before refusing:\n${out}")
  endif()
  message(STATUS "${err}")
endfunction()
refused("was trained on data '1800 bytes, fnv1a64 [0-9a-f]+' but --data [^ ]*b.txt is '1640 bytes, fnv1a64 [0-9a-f]+'"
        --data "${WORK_DIR}/b.txt" --seed 4)
refused("was trained on data '1800 bytes, fnv1a64 [0-9a-f]+' but --data \\(none: synthetic\\) is 'synthetic'" --seed 4)
refused("was trained with --seed 4 but this run has --seed 5" --data "${WORK_DIR}/a.txt" --seed 5)

# The same data under another name is the same data; --resume-anyway goes on, saying so.
file(COPY_FILE "${WORK_DIR}/a.txt" "${WORK_DIR}/copy.txt")
run(--resume "${ckpt}" --data "${WORK_DIR}/copy.txt" --seed 4)
if(run_output MATCHES "note:")
  message(FATAL_ERROR "a resume on the same data said:\n${run_output}")
endif()
run(--resume "${ckpt}" --data "${WORK_DIR}/b.txt" --seed 4 --resume-anyway)
if(NOT run_output MATCHES "note: checkpoint [^\n]*a.st was trained on data [^\n]+; continuing anyway \\(--resume-anyway\\)")
  message(FATAL_ERROR "--resume-anyway did not say what differs:\n${run_output}")
endif()

# A checkpoint written before the fields (the same file with them blanked
# out of its header, which may end in spaces) loads, with a note.
file(READ "${ckpt}" size_hex LIMIT 8 HEX)
string(REGEX REPLACE "(..)(..)(..)(..)(..)(..)(..)(..)" "\\8\\7\\6\\5\\4\\3\\2\\1" size_hex "${size_hex}")
math(EXPR header "0x${size_hex}")
file(READ "${ckpt}" json OFFSET 8 LIMIT ${header})
string(REGEX REPLACE "\"data_identity\":\"[^\"]*\",|\"seed\":\"[^\"]*\"," "" old_json "${json}")
string(LENGTH "${old_json}" length)
math(EXPR pad "${header} - ${length}")
if(pad LESS 20)
  message(FATAL_ERROR "could not remove the fields from the header: ${old_json}")
endif()
string(REPEAT " " ${pad} spaces)
file(WRITE "${WORK_DIR}/old_header.json" "${old_json}${spaces}")
file(COPY_FILE "${ckpt}" "${WORK_DIR}/old.st")
execute_process(COMMAND dd "if=${WORK_DIR}/old_header.json" "of=${WORK_DIR}/old.st" bs=1 seek=8 conv=notrunc
                RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
run(--resume "${WORK_DIR}/old.st" --data "${WORK_DIR}/b.txt" --seed 9)
if(NOT run_output MATCHES "note: checkpoint [^\n]*old.st records no data identity or seed \\(written before they were\\); not checked")
  message(FATAL_ERROR "an old checkpoint did not load with a note:\n${run_output}")
endif()
