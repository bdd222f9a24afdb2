# loom's GPT against the PyTorch reference in torch_gpt.py (included from
# tests/CMakeLists.txt). Debian's python3-torch serves the system interpreter only,
# so /usr/bin/python3 is used, never a python3 that happens to come first on PATH.
# Without torch (or without that interpreter) the tests exit 77: reported as skipped.
find_program(LOOM_SYSTEM_PYTHON python3 PATHS /usr/bin NO_DEFAULT_PATH)

set(_loom_parity_script "${CMAKE_CURRENT_LIST_DIR}/torch_gpt.py")
if(LOOM_SYSTEM_PYTHON)
  set(_loom_parity_python "${LOOM_SYSTEM_PYTHON}")
else()
  set(_loom_parity_python "")
endif()

# The script's own check: its safetensors reader/writer and comparator, an f32 run
# against an f64 one, and corrupted dumps that must be rejected. Needs no C++ target.
add_test(NAME "parity: torch_gpt.py self-test (reader, writer, f32 vs f64, corrupted dumps fail)"
         COMMAND sh -c "if [ -z \"$1\" ]; then echo 'SKIPPED: no /usr/bin/python3'; exit 77; fi; exec \"$1\" \"$2\" --self-test"
                 sh "${_loom_parity_python}" "${_loom_parity_script}")
set_tests_properties("parity: torch_gpt.py self-test (reader, writer, f32 vs f64, corrupted dumps fail)" PROPERTIES
  SKIP_RETURN_CODE 77 TIMEOUT 120 PASS_REGULAR_EXPRESSION "self-test passed")

# loom writes its weights, batches, gradients and losses; torch recomputes and compares.
# The directory is emptied first so that files of an earlier run are never compared.
if(TARGET loom_gpt_dump)
  set(_loom_parity_dir "${CMAKE_CURRENT_BINARY_DIR}/parity_dump")
  add_test(NAME "parity: loom GPT matches PyTorch (loss, gradients, 10 AdamW steps)"
           COMMAND sh -c "if [ -z \"$3\" ]; then echo 'SKIPPED: no /usr/bin/python3'; exit 77; fi; rm -rf \"$2\" && mkdir -p \"$2\" && \"$1\" --out \"$2\" && exec \"$3\" \"$4\" \"$2\""
                   sh "$<TARGET_FILE:loom_gpt_dump>" "${_loom_parity_dir}" "${_loom_parity_python}" "${_loom_parity_script}")
  set_tests_properties("parity: loom GPT matches PyTorch (loss, gradients, 10 AdamW steps)" PROPERTIES
    SKIP_RETURN_CODE 77 TIMEOUT 300 PASS_REGULAR_EXPRESSION "parity passed")
endif()

# loom's GPT against Hugging Face transformers' GPT-2 (hf_gpt2.py): a train_gpt checkpoint
# converted by scripts/loom_to_hf_gpt2.py gives the same greedy tokens and logits. The test
# installs transformers itself (scripts/transformers_venv.sh, a venv over Debian's torch);
# without it (no PyPI, no python3-torch) it exits 77 with the reason: reported as skipped.
set(_loom_hf_script "${CMAKE_CURRENT_LIST_DIR}/hf_gpt2.py")
add_test(NAME "parity: loom_to_hf_gpt2.py refuses files that are not loom GPT checkpoints, one line each"
         COMMAND sh -c "if [ -z \"$1\" ]; then echo 'SKIPPED: no /usr/bin/python3'; exit 77; fi; rm -rf \"$3\" && exec \"$1\" \"$2\" --converter-errors \"$3\""
                 sh "${_loom_parity_python}" "${_loom_hf_script}" "${CMAKE_CURRENT_BINARY_DIR}/hf_converter_errors")
set_tests_properties("parity: loom_to_hf_gpt2.py refuses files that are not loom GPT checkpoints, one line each" PROPERTIES
  SKIP_RETURN_CODE 77 TIMEOUT 60 PASS_REGULAR_EXPRESSION "converter errors passed")
# train_gpt and generate_gpt are examples (examples/ is added after tests/): named by generator expression.
if(TARGET loom_gpt_greedy AND LOOM_BUILD_EXAMPLES)
  add_test(NAME "parity: a loom checkpoint in transformers' GPT2LMHeadModel gives loom's greedy tokens and logits"
           COMMAND sh -c "if [ -z \"$1\" ]; then echo 'SKIPPED: no /usr/bin/python3'; exit 77; fi; rm -rf \"$6\" && exec \"$1\" \"$2\" --run --train-gpt \"$3\" --generate-gpt \"$4\" --greedy \"$5\" --work \"$6\""
                   sh "${_loom_parity_python}" "${_loom_hf_script}" "$<TARGET_FILE:train_gpt>" "$<TARGET_FILE:generate_gpt>"
                   "$<TARGET_FILE:loom_gpt_greedy>" "${CMAKE_CURRENT_BINARY_DIR}/hf_parity")
  set_tests_properties("parity: a loom checkpoint in transformers' GPT2LMHeadModel gives loom's greedy tokens and logits" PROPERTIES
    SKIP_RETURN_CODE 77 TIMEOUT 300 PASS_REGULAR_EXPRESSION "hf parity passed")
endif()
