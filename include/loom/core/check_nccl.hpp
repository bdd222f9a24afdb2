// LOOM_NCCL_CHECK: turns a failed NCCL call into loom::Error naming the call,
// NCCL's error string, its last detailed message, and the place (link loom::nccl).
// Calls on a live communicator go through NcclTransport::check instead
// (comm/transport_nccl.hpp), which also aborts the communicator.
#pragma once

#include <nccl.h>

#include <string>

#include "loom/core/error.hpp"

namespace loom::detail {

// "ncclSend(...) failed: <NCCL's error string> - <its last detailed message>".
[[nodiscard]] inline std::string nccl_failure_text(ncclResult_t code, const char* call) {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 13, 0)
    const char* detail = ncclGetLastError(nullptr);  // the detailed reason, since NCCL 2.13
#else
    const char* detail = nullptr;
#endif
    return concat(call, " failed: ", ncclGetErrorString(code), (detail != nullptr && *detail != '\0') ? " - " : "",
                  detail != nullptr ? detail : "");
}

[[noreturn]] inline void nccl_failed(ncclResult_t code, const char* call, ::loom::SourceLocation where) {
    throw Error(nccl_failure_text(code, call), where);
}

}  // namespace loom::detail

#define LOOM_NCCL_CHECK(call)                                                                \
    do {                                                                                     \
        const ncclResult_t loom_nccl_status_ = (call);                                       \
        if (loom_nccl_status_ != ncclSuccess) [[unlikely]]                                   \
            ::loom::detail::nccl_failed(loom_nccl_status_, #call, ::loom::SourceLocation::current()); \
    } while (false)
