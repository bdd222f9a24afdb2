# Pipelines and tensor parallelism end to end: train_gpt with every schedule
# (and pp 2 x dp 2 at ZeRO 3, the ZeroPP combination), tp 2 alone, with dp
# and ZeRO 3, and dp x pp x tp, in 1D and in Optimus 2D (tp 4 as a 2 x 2
# grid, with dp and ZeRO 2, under 1F1B and ZB-V), and sequence parallelism (ring and
# Ulysses and their hybrid, with dp x ZeRO 3, with tp under a pipeline) reach the serial run's final loss to the
# printed digits; pipelined and tensor-parallel checkpoints load into the
# serial run bit for bit (the re-saved file is identical); --trace records
# every rank's F/B/W and p2p. Args: TRAIN_GPT (the binary), WORK_DIR.
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
set(model --layers 4 --width 32 --heads 2 --seq 16 --batch 8 --steps 6 --seed 5)
include("${CMAKE_CURRENT_LIST_DIR}/train_gpt_run.cmake")
function(final_loss out_var)
  string(REGEX MATCH "final loss [0-9.]+" line "${run_output}")
  if(line STREQUAL "")
    message(FATAL_ERROR "no final loss in:\n${run_output}")
  endif()
  set(${out_var} "${line}" PARENT_SCOPE)
endfunction()

run()
final_loss(serial)
foreach(flags
    "--pp 2 --schedule gpipe --micro-batches 4"
    "--pp 2 --schedule 1f1b --micro-batches 4"
    "--pp 2 --schedule interleaved --micro-batches 4"
    "--pp 2 --schedule zb --micro-batches 4"
    "--pp 2 --schedule zbv --micro-batches 2"
    "--pp 4 --schedule 1f1b --micro-batches 8 --partition 1,1,1,1"
    "--pp 2 --dp 2 --zero 3 --schedule zb --micro-batches 2"
    "--tp 2"
    "--tp 2 --dp 2 --zero 3"
    "--tp 2 --pp 2 --dp 2 --schedule zb --micro-batches 2"
    "--tp 4 --tp-mode 2d"
    "--tp 4 --tp-mode 2d --dp 2 --zero 2"
    "--tp 4 --tp-mode 2d --pp 2 --schedule 1f1b --micro-batches 2"
    "--tp 4 --tp-mode 2d --pp 2 --schedule zbv --micro-batches 2"
    "--sp 2"
    "--sp 4"
    "--sp 2 --sp-mode ulysses --sp-layout contiguous"
    "--sp 4 --sp-mode hybrid --ulysses 2"
    "--sp 2 --dp 2 --zero 3"
    "--sp 2 --tp 2 --pp 2 --schedule zb --micro-batches 2")
  separate_arguments(flags)
  run(${flags})
  final_loss(piped)
  if(NOT piped STREQUAL serial)
    message(FATAL_ERROR "train_gpt ${flags}: ${piped}, serial run: ${serial}")
  endif()
endforeach()

# A checkpoint from a pipeline holds the whole model in the serial layout.
run(--pp 2 --dp 2 --zero 3 --schedule zbv --micro-batches 2 --until 3 --save "${WORK_DIR}/piped.safetensors")
run(--until 3 --resume "${WORK_DIR}/piped.safetensors" --save "${WORK_DIR}/serial.safetensors")
run(--pp 2 --schedule 1f1b --until 3 --resume "${WORK_DIR}/piped.safetensors" --save "${WORK_DIR}/piped_again.safetensors")
# And one from tensor-parallel ranks, put back together whole.
run(--tp 2 --dp 2 --zero 3 --until 3 --save "${WORK_DIR}/tp.safetensors")
run(--until 3 --resume "${WORK_DIR}/tp.safetensors" --save "${WORK_DIR}/tp_serial.safetensors")
# And one from a 2D grid: whole in the serial layout, and loadable by a grid again.
run(--tp 4 --tp-mode 2d --until 3 --save "${WORK_DIR}/grid.safetensors")
run(--until 3 --resume "${WORK_DIR}/grid.safetensors" --save "${WORK_DIR}/grid_serial.safetensors")
run(--tp 4 --tp-mode 2d --until 3 --resume "${WORK_DIR}/grid_serial.safetensors" --save "${WORK_DIR}/grid_again.safetensors")
# Each copy re-saved from a checkpoint it loaded is byte for byte that checkpoint.
function(same_as original what)
  foreach(copy ${ARGN})
    execute_process(COMMAND "${CMAKE_COMMAND}" -E compare_files "${WORK_DIR}/${original}.safetensors"
                            "${WORK_DIR}/${copy}.safetensors" RESULT_VARIABLE differ)
    if(NOT differ EQUAL 0)
      message(FATAL_ERROR "${copy}.safetensors differs from the ${what} checkpoint it loaded")
    endif()
  endforeach()
endfunction()
# And one from sequence-parallel ranks (gradients reduced over dp x sp).
run(--sp 2 --dp 2 --zero 3 --until 3 --save "${WORK_DIR}/sp.safetensors")
run(--until 3 --resume "${WORK_DIR}/sp.safetensors" --save "${WORK_DIR}/sp_serial.safetensors")
same_as(sp "sequence-parallel" sp_serial)
same_as(tp "tensor-parallel" tp_serial)
same_as(grid "Optimus 2D" grid_serial grid_again)
same_as(piped "pipelined" serial piped_again)

# The trace shows each rank's forward, B, W and the p2p between stages.
run(--pp 2 --schedule zb --micro-batches 2 --steps 2 --trace "${WORK_DIR}/trace.json")
file(READ "${WORK_DIR}/trace.json" trace)
foreach(expect "\"pid\":0" "\"pid\":1" "\"cat\":\"forward\"" "\"cat\":\"backward_input\"" "\"cat\":\"backward_weight\""
               "send activation c0 mb1 to rank 1" "recv activation c1 mb1 from rank 0" "recv gradient c0 mb1 from rank 1")
  string(FIND "${trace}" "${expect}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "the pipeline trace lacks ${expect}")
  endif()
endforeach()
message(STATUS "every schedule reaches the serial loss (${serial}); pipelined checkpoints reload bit for bit; the trace has F/B/W and p2p")
