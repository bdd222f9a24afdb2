// Under mpirun, a test that throws on one rank leaves the other ranks in the
// collective it skipped: they would wait the communicator's timeout (five
// minutes a call) and then fail on, call after call, until ctest's timeout
// killed the job. This listener ends the job at once instead: it prints the
// rank, the test and the exception's message, then calls MPI_Abort. An
// expected exception (CHECK_THROWS, loom_test::message_of) never reaches it;
// only one that escaped a test's code does (Catch's ThrewException).
// Compiled alone (no unity batch): the listener interface needs
// CATCH_CONFIG_EXTERNAL_INTERFACES before catch.hpp.
#define CATCH_CONFIG_EXTERNAL_INTERFACES
#include <catch2/catch.hpp>
#include <mpi.h>

#include <cstdio>
#include <string>

namespace {

struct AbortOnThrow : Catch::TestEventListenerBase {
    using TestEventListenerBase::TestEventListenerBase;

    void testCaseStarting(Catch::TestCaseInfo const& info) override { test_ = info.name; }

    bool assertionEnded(Catch::AssertionStats const& stats) override {
        const Catch::AssertionResult& result = stats.assertionResult;
        if (result.getResultType() != Catch::ResultWas::ThrewException) return true;
        int rank = 0;
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        const Catch::SourceLineInfo where = result.getSourceInfo();
        std::fprintf(stderr,
                     "mpi: rank %d: test \"%s\" threw at %s:%zu: %s; aborting the job (the other ranks would wait "
                     "in a collective)\n",
                     rank, test_.c_str(), where.file, where.line, result.getMessage().c_str());
        std::fflush(stdout);
        std::fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, 1);
        return true;
    }

private:
    std::string test_;
};

}  // namespace

CATCH_REGISTER_LISTENER(AbortOnThrow)
