// What train_gpt writes and when, so that nothing is lost: the outputs are
// probed before anything is built (a bad --save or --trace fails in one line,
// not after hours of training), a resume is checked to continue the same run
// (data and seed, train/data_identity.hpp); every save, periodic or final,
// first checks the state is finite (train/executor_checkpoint.hpp), so a
// diverged run never replaces the last good checkpoint. Included by
// train_gpt.cpp inside its anonymous namespace, after train_gpt_flags.hpp.
#pragma once

// Before any rank starts: the files the run will write can be written, the
// temporaries a crashed run left beside --save are removed, and --resume
// continues this run's data and seed (or --resume-anyway says go on).
inline void check_outputs_and_resume(const Flags& flags) {
    // A sharded --save is a directory: made now, and its index probed.
    const std::string saved_file = flags.sharded ? (std::filesystem::path(flags.save) / "index.json").string() : flags.save;
    const std::array<std::pair<const char*, const std::string*>, 2> outputs{{{"--save", &saved_file}, {"--trace", &flags.trace}}};
    for (const auto& [flag, path] : outputs) {
        if (path->empty()) continue;
        try {
            std::error_code made;
            if (flags.sharded && path == &saved_file) std::filesystem::create_directories(flags.save, made);
            LOOM_CHECK(!made, "cannot create the directory: ", made.message());
            loom::io::probe_writable(*path);
        } catch (const loom::Error& e) {
            throw loom::Error("train_gpt: " + std::string(flag) + " " + (path == &saved_file ? flags.save : *path) +
                              " cannot be written (checked before training): " + e.message());
        }
    }
    if (!flags.save.empty())
        for (const auto& stale : loom::io::remove_stale_temporaries(saved_file))
            std::printf("removed %s, a temporary file left by a run that was killed\n", stale.string().c_str());
    if (!flags.resume.empty()) {
        const std::string note =
            std::filesystem::is_directory(flags.resume)
                ? loom::train::check_run_identity(loom::exec::read_sharded_index(flags.resume).metadata, flags.resume,
                                                  flags.data, flags.seed, flags.resume_anyway, "--resume-anyway")
                : loom::train::check_run_identity(loom::io::SafetensorsFile(flags.resume).metadata(), flags.resume,
                                                  flags.data, flags.seed, flags.resume_anyway, "--resume-anyway");
        if (!note.empty()) std::printf("note: %s\n", note.c_str());
    }
}

// After a stop signal: where the run stands and how to go on.
inline void report_stop(const Flags& flags, std::int64_t done) {
    std::printf("train_gpt: %s: stopped after step %lld of %lld; %s\n", loom::train::StopSignal::name().c_str(),
                static_cast<long long>(done), static_cast<long long>(flags.until),
                flags.save.empty() ? "no --save, so these steps are not kept"
                                   : ("continue with --resume " + flags.save).c_str());
}
