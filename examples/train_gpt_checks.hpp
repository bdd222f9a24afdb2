// What train_gpt's flags must agree on before anything is built, checked
// the same way on every rank so that every rank stops with the same one-line
// message. The rules are the library's (train/gpt_training_rules.hpp: the
// settings among themselves, the degrees by the planner's rules, a device's
// limits, the memory, the files), worded here with train_gpt's flags; what
// only train_gpt's flags say is checked here. Included by train_gpt.cpp
// inside its anonymous namespace, after train_gpt_flags.hpp.
#pragma once

// The dp degree the flags give in a world of `world` ranks (under mpirun,
// known from the launcher before MPI starts, so every process refuses alike).
inline int dp_degree(const Flags& flags, int world) {
    return flag_checked("", [&] { return loom::train::dp_degree(flags, world, flag_names); });
}

// The memory preflight for `ranks_in_process` host ranks at dp degree `dp`.
inline void check_memory(const Flags& flags, int dp, int ranks_in_process) {
    if (flags.no_memory_check) return;
    try {
        loom::train::check_training_memory(flags, dp, ranks_in_process, flag_names);
    } catch (const loom::Error& e) {
        throw loom::Error("train_gpt: " + e.message() + " (checked before allocating)");
    }
}

// Before any rank starts: --device's limits, and that --cluster's links
// (shaped between host threads by host clocks, while a GPU's work runs
// asynchronously to them) are not asked of a device; the files written and
// resumed (a note when --resume-anyway goes on).
inline void check_device_and_files(const Flags& flags) {
    flag_checked("", [&] { loom::train::check_device_settings(flags, flag_names); });
    std::ostringstream where;
    where << flags.device;
    if (flags.device.kind != loom::DeviceKind::host && !flags.cluster.empty())
        usage_error("--device " + where.str() + " runs every flag but --cluster, whose links delay rank threads by "
                    "host clocks while the GPU's work runs asynchronously to them; drop --cluster or use "
                    "--device host");
    try {
        const std::string note = loom::train::check_training_files(flags, flags.resume_anyway, flag_names);
        if (!note.empty()) std::printf("note: %s\n", note.c_str());
    } catch (const loom::Error& e) {
        throw loom::Error("train_gpt: " + e.message());
    }
}

// After a stop signal: where the run stands and how to go on.
inline void report_stop(const Flags& flags, std::int64_t done) {
    std::printf("train_gpt: %s: stopped after step %lld of %lld; %s\n", loom::train::StopSignal::name().c_str(),
                static_cast<long long>(done), static_cast<long long>(flags.until),
                flags.save.empty() ? "no --save, so these steps are not kept"
                                   : ("continue with --resume " + flags.save).c_str());
}
