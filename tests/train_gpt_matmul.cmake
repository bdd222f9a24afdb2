# train_gpt --matmul bf16 reaches the layers: the same run at f32 and at bf16
# (dp 2 x tp 2 rank threads) ends at different losses, and the bf16 run says
# it rounds. (How close the two are is tests/nn/test_linear_bf16.cpp's.)
# Run with -DTRAIN_GPT=<binary>.
set(model --layers 1 --width 16 --heads 2 --seq 8 --batch 4 --steps 12 --lr 3e-3 --dp 2 --tp 2)
include("${CMAKE_CURRENT_LIST_DIR}/train_gpt_run.cmake")


run(--matmul f32)
final_loss("${run_output}" f32)
run(--matmul bf16)
if(NOT run_output MATCHES "matrix products: bf16 operands, f32 sums and outputs")
  message(FATAL_ERROR "the bf16 run does not say it rounds:\n${run_output}")
endif()
final_loss("${run_output}" bf16)
if(f32 STREQUAL bf16)
  message(FATAL_ERROR "--matmul bf16 ended at the f32 run's loss ${f32}: the precision did not reach the layers")
endif()
message(STATUS "final loss: f32 ${f32}, bf16 ${bf16}")

# Every sequence-parallel attention runs at bf16: ring (the default), the
# hybrid, and Ulysses. (Their equivalence to the serial bf16 run is
# tests/parallel/test_matmul_bf16_equivalence.cpp's.)
foreach(mode "--sp;2" "--sp;4;--sp-mode;hybrid;--ulysses;2" "--sp;2;--sp-mode;ulysses")
  set(model --layers 1 --width 16 --heads 2 --seq 8 --batch 4 --steps 2 ${mode})
  run(--matmul bf16)
  if(NOT run_output MATCHES "final loss ([0-9.]+) after 2 steps")
    message(FATAL_ERROR "no final loss with ${mode} at bf16:\n${run_output}")
  endif()
endforeach()
