# Tests run under mpirun (included from tests/CMakeLists.txt when MPI is found).

# Core facts and the Mpi communicator, one Catch2 binary; every rank runs the
# same tests and the worst result decides (mpi/main.cpp).
add_executable(loom_mpi_tests mpi/main.cpp mpi/abort_on_throw.cpp mpi/test_mpi_core.cpp mpi/test_mpi_comm.cpp mpi/test_mpi_parallel.cpp
               mpi/test_mpi_serving.cpp mpi/test_mpi_train.cpp)
target_link_libraries(loom_mpi_tests PRIVATE loom::mpi loom_catch_session)
target_include_directories(loom_mpi_tests PRIVATE "${CMAKE_CURRENT_SOURCE_DIR}")
loom_strict(loom_mpi_tests)
loom_unity_tests(loom_mpi_tests)
loom_quick_compile(loom_mpi_tests)
set_source_files_properties(mpi/abort_on_throw.cpp PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
loom_add_mpi_test("mpi: core on 2 processes" 2 loom_mpi_tests "~[comm]~[parallel]~[pipeline]~[tensor]~[sequence]~[compress]~[optex]~[bf16]~[recompute]~[serving]~[pp_serving]~[kraken_serving]~[pp_tp_serving]~[user_model_serving]~[pool_serving]~[user_model_pp_serving]~[kraken]")
loom_add_mpi_test("mpi: core on 3 processes" 3 loom_mpi_tests "~[comm]~[parallel]~[pipeline]~[tensor]~[sequence]~[compress]~[optex]~[bf16]~[recompute]~[serving]~[pp_serving]~[kraken_serving]~[pp_tp_serving]~[user_model_serving]~[pool_serving]~[user_model_pp_serving]~[kraken]")
foreach(_procs 2 3 4)
  loom_add_mpi_test("mpi: communicator on ${_procs} processes" ${_procs} loom_mpi_tests "[comm]")
  # The equivalence suite of tests/parallel, written once for every transport.
  loom_add_mpi_test("mpi: data parallel and ZeRO 0-3 equal serial on ${_procs} processes" ${_procs} loom_mpi_tests "[parallel]")
endforeach()
loom_add_mpi_test("mpi: every pipeline schedule, alone and with dp 2 x ZeRO 0-3, equals serial on 4 processes" 4
                  loom_mpi_tests "[pipeline]")
foreach(_procs 3 4)
  loom_add_mpi_test("mpi: every gradient compressor trains as the serial run of its algorithm on ${_procs} processes"
                    ${_procs} loom_mpi_tests "[compress]")
endforeach()
foreach(_procs 3 4)
  loom_add_mpi_test("mpi: OptEx with one worker per process equals its serial definition on ${_procs} processes"
                    ${_procs} loom_mpi_tests "[optex]")
endforeach()
loom_add_mpi_test("mpi: tensor parallelism (tp 4 in 1D and 2D, tp 2 x dp 2 at ZeRO 3) equals serial on 4 processes" 4
                  loom_mpi_tests "[tensor]")
loom_add_mpi_test("mpi: 3D parallelism dp 2 x pp 2 x tp 2, and dp 2 x tp 4 in 2D, equals serial on 8 processes" 8 loom_mpi_tests "[tensor]")
foreach(_procs 2 4)
  loom_add_mpi_test("mpi: tensor-parallel serving at tp ${_procs} gives the whole model's tokens" ${_procs}
                    loom_mpi_tests "[serving]")
  loom_add_mpi_test("mpi: pipeline-parallel serving at pp ${_procs} gives the whole model's tokens" ${_procs}
                    loom_mpi_tests "[pp_serving]")
  loom_add_mpi_test("mpi: Kraken serving at tp ${_procs} gives the whole model's tokens" ${_procs}
                    loom_mpi_tests "[kraken_serving]")
  loom_add_mpi_test("mpi: a user model's serving at tp ${_procs} gives the whole model's tokens" ${_procs}
                    loom_mpi_tests "[user_model_serving]")
endforeach()
loom_add_mpi_test("mpi: pp 2 x tp 2 serving gives the whole model's tokens on 4 processes (GPT, user model, Kraken)" 4 loom_mpi_tests
                  "[pp_tp_serving]")
foreach(_procs 2 3)
  loom_add_mpi_test("mpi: a user model's pipeline-parallel serving at pp ${_procs} gives the whole model's tokens"
                    ${_procs} loom_mpi_tests "[user_model_pp_serving]")
endforeach()
loom_add_mpi_test("mpi: peer memory pooling, each of 2 processes reading half the blocks from the other, gives the resident model's tokens" 2
                  loom_mpi_tests "[pool_serving]")
loom_add_mpi_test("mpi: Kraken with sub-layer i on tp rank i (tp 4, dp 2 x tp 2 ZeRO 3, pp 2 x tp 2) equals serial on 4 processes" 4
                  loom_mpi_tests "[kraken]")
loom_add_mpi_test("mpi: recomputation (Full, Selective, Budget) is bit-identical on dp 2 x pp 2 ZB-H1 ZeRO 3 and in the executor's gradient, 4 processes" 4
                  loom_mpi_tests "[recompute]")
loom_add_mpi_test("mpi: recomputation (Full, Selective, Budget) is bit-identical on dp 2 x pp 2 x tp 2 ZeRO 3 and in the executor's gradient, 8 processes" 8
                  loom_mpi_tests "[recompute]")

# Faults that end the job: one scenario per run. The program verifies what
# every rank saw and prints the verdict before MpiSession aborts the job, so
# the exit status says nothing and the output decides; the timeout is the
# backstop against a hang (each run takes about a second).
add_executable(loom_mpi_fault_tests mpi/test_mpi_faults.cpp)
target_link_libraries(loom_mpi_fault_tests PRIVATE loom::mpi)
loom_strict(loom_mpi_fault_tests)
function(_loom_mpi_fault_test name procs)
  loom_add_mpi_test("${name}" ${procs} loom_mpi_fault_tests ${ARGN})
  set_tests_properties("${name}" PROPERTIES TIMEOUT 60
    PASS_REGULAR_EXPRESSION "fault test passed" FAIL_REGULAR_EXPRESSION "FAIL:")
endfunction()
foreach(_procs 2 3)
  _loom_mpi_fault_test("mpi: faults: a rank that throws fails the others on ${_procs} processes" ${_procs} throws)
  _loom_mpi_fault_test("mpi: faults: a rank that never arrives times out on ${_procs} processes" ${_procs} absent)
endforeach()
_loom_mpi_fault_test("mpi: faults: a rank that throws fails the others with check_calls on 3 processes" 3 throws check)
_loom_mpi_fault_test("mpi: faults: a rank that never arrives times out with check_calls on 3 processes" 3 absent check)
_loom_mpi_fault_test("mpi: faults: ranks waiting on each other time out alike on 3 processes" 3 stuck)
_loom_mpi_fault_test("mpi: faults: a rank stopped inside a large all_reduce times out like an absent one on 3 processes"
                     3 stalled)

# The flight recorder: a job goes wrong under mpirun -np 4 with the recorder on,
# then loom-flight merges the four files and must name the rank and the call.
add_executable(loom_mpi_flight_job mpi/flight_recorder_job.cpp)
target_link_libraries(loom_mpi_flight_job PRIVATE loom::mpi)
loom_strict(loom_mpi_flight_job)
if(LOOM_BUILD_EXAMPLES)  # loom-flight is built with the tools
  _loom_mpiexec_flags(_flight_flags)
  string(JOIN " " _flight_flags ${_flight_flags})
  foreach(_scenario mismatch stall)
    set(_dir "${CMAKE_CURRENT_BINARY_DIR}/flight_${_scenario}")
    add_test(NAME "mpi: flight recorder: loom-flight names the rank and call of a ${_scenario} on 4 processes"
      COMMAND sh -c "rm -rf '${_dir}' && mkdir -p '${_dir}' && LOOM_FLIGHT_RECORDER_DIR='${_dir}' '${MPIEXEC_EXECUTABLE}' ${MPIEXEC_NUMPROC_FLAG} 4 ${_flight_flags} '$<TARGET_FILE:loom_mpi_flight_job>' ${_scenario}; '$<TARGET_FILE:loom-flight>' '${_dir}'")
    set_tests_properties("mpi: flight recorder: loom-flight names the rank and call of a ${_scenario} on 4 processes"
      PROPERTIES PROCESSORS 4 TIMEOUT 60 ENVIRONMENT "ASAN_OPTIONS=detect_leaks=0")
  endforeach()
  set_tests_properties("mpi: flight recorder: loom-flight names the rank and call of a mismatch on 4 processes" PROPERTIES
    PASS_REGULAR_EXPRESSION "loom flight report: 4 file\\(s\\).*\ndiverged: call 3 of group \\[0,1,2,3\\]: world rank 2 called all_reduce of 7 x f32 \\(sum\\), world ranks 0, 1, 3 called all_reduce of 8 x f32 \\(sum\\)\n"
    FAIL_REGULAR_EXPRESSION "stalled")
  set_tests_properties("mpi: flight recorder: loom-flight names the rank and call of a stall on 4 processes" PROPERTIES
    PASS_REGULAR_EXPRESSION "loom flight report: 4 file\\(s\\).*\nstalled: world rank 3 (arrived late at call 2 of group \\[0,1,2,3\\] \\(all_reduce of 8 x f32 \\(sum\\)\\), [0-9.]+ s after world rank [012] had given up|in group \\[0,1,2,3\\]: its last call was 1 \\(all_reduce of 8 x f32 \\(sum\\)\\). world ranks 0, 1, 2 reached call 2 )"
    FAIL_REGULAR_EXPRESSION "stalled: world rank [012]|diverged")
endif()
loom_add_mpi_test("mpi: sequence parallelism (ring sp 4, Ulysses dp 2 x sp 2) equals serial on 4 processes" 4
                  loom_mpi_tests "[sequence]")
loom_add_mpi_test("mpi: sequence parallelism dp 2 x sp 2 x tp 2 at ZeRO 3 equals serial on 8 processes" 8
                  loom_mpi_tests "[sequence]")
loom_add_mpi_test("mpi: bf16 matrix products (dp 2 x tp 2 at ZeRO 1, a 2 x 2 grid, ring dp 2 x sp 2) equal the bf16 serial run on 4 processes"
                  4 loom_mpi_tests "[bf16]")
