#pragma once
// Ranks agreeing on what some of them know: whether any rank failed (and then on the lowest
// failing rank's error), and a root's string. Collective over the communicator given; with a
// communicator of one rank they make no MPI call at all, so a lone checkpoint writer also works
// in a forked child (the crash test).
#include <mpi.h>

#include <memory>
#include <string>

#include "pdtrain/core/error.hpp"

namespace pdtrain {

// How far an error agreed over a communicator reaches.
enum class ErrorScope {
  job,    // the communicator is the whole job: the error is marked collective (every rank holds
          // it), so the job can end in order with its exit status
  group,  // a part of the job (the holders): ranks outside it may be waiting on these, so the
          // error stays this group's, and the app must abort the job if it reaches main
};

// If any rank of `comm` caught an error (`local`, nullptr when this rank has none), every rank
// throws the error of the lowest such rank; returns normally when no rank has one.
void rethrow_collectively(MPI_Comm comm, const Error* local, ErrorScope scope);

// Runs `body` on this rank, then agrees over `comm` on the pdtrain::Errors it threw, as
// rethrow_collectively() does.
template <class Body>
void run_collectively(MPI_Comm comm, ErrorScope scope, Body&& body) {
  std::unique_ptr<Error> err;
  try {
    body();
  } catch (const Error& e) {
    err = std::make_unique<Error>(e);
  }
  rethrow_collectively(comm, err.get(), scope);
}

// Every rank of `comm` gets root's `s`.
void broadcast_string(MPI_Comm comm, std::string& s, int root = 0);

}  // namespace pdtrain
