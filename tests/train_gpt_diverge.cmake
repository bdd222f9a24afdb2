# A run that diverges stops at the step whose loss is not finite, naming it,
# exits non-zero, and leaves the good checkpoint named by --save byte for
# byte as it was; a checkpoint holding a NaN is refused when loaded.
# Args: TRAIN_GPT (the binary), WORK_DIR.
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
set(model --layers 1 --width 16 --heads 2 --seq 8 --batch 2 --steps 200)
set(ckpt "${WORK_DIR}/good.st")
include("${CMAKE_CURRENT_LIST_DIR}/train_gpt_run.cmake")
run(--until 2 --save "${ckpt}")
# A checkpoint can hold finite values no run reaches: negative second
# moments. Writing -3e38 over the last 16 elements of `tensor` makes AdamW's
# sqrt(v) NaN there: the run diverges on resuming.
function(poison tensor from to)
  file(READ "${from}" size_hex LIMIT 8 HEX)
  string(REGEX REPLACE "(..)(..)(..)(..)(..)(..)(..)(..)" "\\8\\7\\6\\5\\4\\3\\2\\1" size_hex "${size_hex}")
  math(EXPR header "0x${size_hex}")
  file(READ "${from}" json OFFSET 8 LIMIT ${header})
  string(JSON end GET "${json}" "${tensor}" data_offsets 1)
  math(EXPR at "8 + ${header} + ${end} - 64")
  file(COPY_FILE "${from}" "${to}")
  execute_process(COMMAND sh -c "for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16; do printf '\\346\\261\\141\\377'; done | dd of='${to}' bs=1 seek=${at} conv=notrunc 2>/dev/null"
                  RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "could not write into ${to}")
  endif()
endfunction()

function(diverges tensor expect)
  poison("${tensor}" "${ckpt}" "${WORK_DIR}/poisoned.st")
  file(SHA256 "${ckpt}" before)
  execute_process(COMMAND "${TRAIN_GPT}" ${model} ${ARGN} --resume "${WORK_DIR}/poisoned.st" --save "${ckpt}"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  file(SHA256 "${ckpt}" after)
  if(rc EQUAL 0)
    message(FATAL_ERROR "a diverged run exited 0:\n${out}\n${err}")
  endif()
  if(NOT err MATCHES "${expect}")
    message(FATAL_ERROR "a diverged run did not say '${expect}':\n${out}\n${err}")
  endif()
  if(NOT before STREQUAL after)
    message(FATAL_ERROR "a diverged run replaced the good checkpoint ${ckpt}")
  endif()
  file(GLOB temps "${WORK_DIR}/*.tmp-*")
  if(temps)
    message(FATAL_ERROR "a diverged run left ${temps}")
  endif()
  message(STATUS "diverged: ${err}")
endfunction()
# head.weight feeds every logit: the loss goes NaN and the run stops at that step.
diverges(optimizer.v.head.weight "(^|\n)step 3: the loss is nan; the run has diverged")
# The embedding row of a byte the data never holds (the last 16 elements:
# byte 255) gets no gradient, so the loss stays
# finite while the parameters turn NaN: the check before the save stops it.
diverges(optimizer.v.embed.token
         "(^|\n)step 6 \\([^)]+good.st was not written\\): tensor embed.token holds nan at element [0-9]+ of [0-9]+; only finite values are valid"
         --until 6)
# A NaN in the last float of the file (some tensor's last element) is refused when loaded.
file(COPY_FILE "${ckpt}" "${WORK_DIR}/nan.st")
execute_process(COMMAND sh -c "printf '\\000\\000\\300\\177' | dd of=nan.st bs=1 seek=$(( $(wc -c < nan.st) - 4 )) conv=notrunc 2>/dev/null"
                WORKING_DIRECTORY "${WORK_DIR}" RESULT_VARIABLE rc)
execute_process(COMMAND "${TRAIN_GPT}" ${model} --resume "${WORK_DIR}/nan.st" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT err MATCHES "checkpoint [^:]+nan.st: tensor [^ ]+ holds nan at element [0-9]+ of [0-9]+; only finite values are valid")
  message(FATAL_ERROR "a checkpoint holding NaN was not refused (rc ${rc}):\n${out}\n${err}")
endif()
message(STATUS "refused: ${err}")
