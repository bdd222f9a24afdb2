# loom_strict(target): the warning set loom's own tests, examples and
# benchmarks build with. Consumers of the headers get none of this.
include_guard(GLOBAL)

function(loom_strict target)
  set(flags -Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion)
  if(LOOM_WERROR)
    list(APPEND flags -Werror)
  endif()
  target_compile_options(${target} PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:${flags}>")
  if(LOOM_WERROR)
    # nvcc: host-side warnings from our code are errors too.
    target_compile_options(${target} PRIVATE "$<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings>")
  endif()
endfunction()
