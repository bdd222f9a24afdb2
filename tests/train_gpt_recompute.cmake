# train_gpt --recompute: the same run without recomputation, with Full, with
# Selective and with a Budget (piecewise, and as --strategy text) ends at the same loss, to
# the printed digit (the executor's tests check the bits), and the strategy
# line names the policy. dp 2 x pp 2 on 1F1B with micro-batches, on rank threads.
# Run with -DTRAIN_GPT=<binary>.
set(model --layers 2 --width 16 --heads 2 --seq 8 --batch 8 --steps 6 --lr 3e-3 --dp 2 --pp 2 --micro-batches 2)
include("${CMAKE_CURRENT_LIST_DIR}/train_gpt_run.cmake")


run(--recompute none)
final_loss("${run_output}" plain)
run(--recompute full)
if(NOT run_output MATCHES "Recompute<Full>>")
  message(FATAL_ERROR "the strategy line does not name Recompute<Full>:\n${run_output}")
endif()
final_loss("${run_output}" full)
run(--recompute selective)
if(NOT run_output MATCHES "Recompute<Selective>>")
  message(FATAL_ERROR "the strategy line does not name Recompute<Selective>:\n${run_output}")
endif()
final_loss("${run_output}" selective)
run(--recompute budget:20KiB)
final_loss("${run_output}" budget)
run(--strategy "Strategy<DataParallel<>, Pipeline<1F1B>, Recompute<Budget 1 MiB>>")
if(NOT run_output MATCHES "Recompute<Budget 1 MiB>>")
  message(FATAL_ERROR "the strategy line does not name Recompute<Budget 1 MiB>:\n${run_output}")
endif()
final_loss("${run_output}" text)
foreach(other full selective budget text)
  if(NOT ${other} STREQUAL plain)
    message(FATAL_ERROR "--recompute ${other} ended at loss ${${other}}, the run without recomputation at ${plain}")
  endif()
endforeach()
message(STATUS "final loss ${plain} without recomputation, with Full, Selective, a Budget and from --strategy")
