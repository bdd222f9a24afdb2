# OptEx in sharded checkpoints (train/sharded_optex.hpp): a run saved with
# --optex 2 resumes with its history under --optex 3, and under the executor
# (--dp 2 --zero 3); an executor's sharded checkpoint resumes under OptEx
# with an empty history, and says so. With MPI_LAUNCH (mpiexec and its flags
# for 2 processes, |-separated), the same save written by 2 MPI processes
# resumes to the same final loss as the rank threads' save.
# Args: TRAIN_GPT (the binary), WORK_DIR, optionally MPI_LAUNCH.
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
set(model --layers 2 --width 32 --heads 2 --seq 16 --batch 6 --steps 6 --seed 5 --optex-history 4 --optex-tune 2)
include("${CMAKE_CURRENT_LIST_DIR}/train_gpt_run.cmake")
function(expect pattern what)
  if(NOT run_output MATCHES "${pattern}")
    message(FATAL_ERROR "${what}; the run printed:\n${run_output}")
  endif()
endfunction()

run(--optex 2 --until 3 --sharded --save "${WORK_DIR}/optex2")
expect("saved .*optex2 .step 3, one shard per rank, with OptEx's history." "an OptEx save did not say it kept the history")
run(--optex 3 --resume "${WORK_DIR}/optex2")
expect("resumed from .*optex2 at step 3 with OptEx's history.*final loss [0-9.]+ after 6 steps"
       "--optex 3 did not resume --optex 2's shards with their history")
run(--optex 2 --resume "${WORK_DIR}/optex2")
final_loss("${run_output}" threads_loss)

# The executor, under any strategy, reads an OptEx run's shards and ignores the history.
set(model --layers 2 --width 32 --heads 2 --seq 16 --batch 6 --steps 6 --seed 5)
run(--dp 2 --zero 3 --resume "${WORK_DIR}/optex2")
expect("final loss [0-9.]+ after 6 steps" "the executor did not resume an OptEx run's shards")
run(--dp 2 --zero 1 --until 3 --sharded --save "${WORK_DIR}/executor")
run(--optex 2 --resume "${WORK_DIR}/executor")
expect("OptEx's history starts empty: the checkpoint keeps no OptEx history.*final loss"
       "--optex 2 resumed an executor's shards without saying the history starts empty")

if(MPI_LAUNCH)
  string(REPLACE "|" ";" MPI_LAUNCH "${MPI_LAUNCH}")
  set(model --layers 2 --width 32 --heads 2 --seq 16 --batch 6 --steps 6 --seed 5 --optex-history 4 --optex-tune 2)
  execute_process(COMMAND ${MPI_LAUNCH} "${TRAIN_GPT}" ${model} --optex 2 --until 3 --sharded --save "${WORK_DIR}/mpi"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "mpirun -np 2 train_gpt --optex 2 --sharded failed (${rc}):\n${out}\n${err}")
  endif()
  run(--optex 2 --resume "${WORK_DIR}/mpi")
  final_loss("${run_output}" mpi_loss)
  if(NOT mpi_loss STREQUAL threads_loss)
    message(FATAL_ERROR "resumed from 2 MPI processes' shards: final loss ${mpi_loss}; from rank threads' ${threads_loss}")
  endif()
  message(STATUS "2 MPI processes' OptEx shards resume to the rank threads' final loss, ${mpi_loss}")
endif()
message(STATUS "OptEx's shards resume under --optex 3 with the history and under the executor; the executor's under OptEx")
