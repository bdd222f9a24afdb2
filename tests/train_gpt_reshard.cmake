# Checkpoints do not depend on the strategy: a checkpoint saved by 4 rank
# threads at ZeRO stage 3 loads into 2 ranks at stage 1 and into the serial
# run with bit-identical parameters and moments (each re-saves it without
# training, and the files must equal the original byte for byte), and
# training continues from it with any strategy.
# Args: TRAIN_GPT (the binary), WORK_DIR.
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
set(model --layers 2 --width 32 --heads 2 --seq 16 --batch 8 --steps 6 --seed 3)
include("${CMAKE_CURRENT_LIST_DIR}/train_gpt_run.cmake")
function(same a b)
  execute_process(COMMAND "${CMAKE_COMMAND}" -E compare_files "${WORK_DIR}/${a}" "${WORK_DIR}/${b}" RESULT_VARIABLE differ)
  if(NOT differ EQUAL 0)
    message(FATAL_ERROR "${a} and ${b} differ: a checkpoint changed when loaded under another strategy")
  endif()
endfunction()
run(--dp 4 --zero 3 --micro-batches 2 --until 3 --save "${WORK_DIR}/dp4_zero3.safetensors")
run(--dp 2 --zero 1 --until 3 --resume "${WORK_DIR}/dp4_zero3.safetensors" --save "${WORK_DIR}/dp2_zero1.safetensors")
run(--until 3 --resume "${WORK_DIR}/dp4_zero3.safetensors" --save "${WORK_DIR}/serial.safetensors")
run(--dp 2 --zero 2 --until 3 --resume "${WORK_DIR}/dp4_zero3.safetensors" --save "${WORK_DIR}/dp2_zero2.safetensors")
same(dp4_zero3.safetensors dp2_zero1.safetensors)
same(dp4_zero3.safetensors serial.safetensors)
same(dp4_zero3.safetensors dp2_zero2.safetensors)
# Training goes on from it under another strategy.
run(--dp 2 --zero 1 --resume "${WORK_DIR}/dp4_zero3.safetensors" --save "${WORK_DIR}/finished.safetensors")
message(STATUS "a dp=4 ZeRO-3 checkpoint loads bit-identically into dp=2 ZeRO-1, dp=2 ZeRO-2 and the serial run")
