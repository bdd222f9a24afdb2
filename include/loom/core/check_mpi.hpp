// LOOM_MPI_CHECK: turns a failed MPI call into loom::Error naming the call,
// MPI's error class and string, and the place (link loom::mpi). MPI's default
// handler aborts instead of returning, so communicators set MPI_ERRORS_RETURN.
#pragma once

#include <mpi.h>

#include "loom/core/error.hpp"

namespace loom::detail {

[[noreturn]] inline void mpi_failed(int code, const char* call, ::loom::SourceLocation where) {
    char text[MPI_MAX_ERROR_STRING] = {};
    int length = 0;
    if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) length = 0;
    int error_class = code;
    MPI_Error_class(code, &error_class);
    throw Error(concat(call, " failed: MPI error ", code, " (class ", error_class, "): ",
                                length > 0 ? text : "unknown MPI error"),
                where);
}

}  // namespace loom::detail

#define LOOM_MPI_CHECK(call)                                                                 \
    do {                                                                                     \
        const int loom_mpi_status_ = (call);                                                 \
        if (loom_mpi_status_ != MPI_SUCCESS) [[unlikely]]                                    \
            ::loom::detail::mpi_failed(loom_mpi_status_, #call, ::loom::SourceLocation::current()); \
    } while (false)
