#pragma once
// Errors and exit codes. Input errors are thrown as pdtrain::Error and turned into one message
// and one exit status for the whole MPI job by the app layer; runtime faults that only one rank
// sees (a CRC mismatch, a failed MPI call) end the whole job at once with fatal_abort().
#include <stdexcept>
#include <string>

namespace pdtrain {

enum class ExitCode : int {
  ok = 0,
  runtime = 1,  // a fault during the run (CRC mismatch, failed library call)
  deck = 2,     // bad deck, bad --set, bad command line
  layout = 3,   // world size or parallel layout that cannot work
  data = 4,     // unreadable or malformed data file / checkpoint
  diverged = 5, // training diverged: a loss or gradient norm that is not finite
};

class Error : public std::runtime_error {
 public:
  Error(ExitCode code, const std::string& msg) : std::runtime_error(msg), code_(code) {}
  ExitCode code() const { return code_; }
  // True when every rank of the job holds this same error (see rethrow_collectively): the job
  // can then end in order. Any other Error was seen by one rank only and must abort the job.
  bool collective() const { return collective_; }
  Error& mark_collective() {
    collective_ = true;
    return *this;
  }

 private:
  ExitCode code_;
  bool collective_ = false;
};

// Ends the whole job (every rank) with `code` after printing `msg` prefixed with this rank.
// Safe to call before MPI_Init or after MPI_Finalize (then it just exits).
[[noreturn]] void fatal_abort(ExitCode code, const std::string& msg);

// "file:line: call failed: detail" used by the checked-call macros.
std::string where(const char* file, int line);

}  // namespace pdtrain

// Checks any condition on a hot or rare path alike; failure ends the job with file/line/rank.
#define PDT_CHECK(cond, msg)                                                              \
  do {                                                                                    \
    if (!(cond))                                                                          \
      ::pdtrain::fatal_abort(::pdtrain::ExitCode::runtime,                                \
                             ::pdtrain::where(__FILE__, __LINE__) + ": " + std::string(msg)); \
  } while (0)
