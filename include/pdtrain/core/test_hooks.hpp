#pragma once
// Every test hook of the production code, in one place. Tests reach into a run only through
// these; production code asks these functions and never reads the environment, or keeps a
// callback, for a test itself. Unless a test sets a hook, it does nothing.
#include <cstdint>
#include <functional>
#include <optional>
#include <string_view>

namespace pdtrain::test_hooks {

// PDTRAIN_TEST_RANKS_PER_NODE=k (k >= 1): node_of_ranks() (layout/) pretends that ranks
// k*i .. k*i+k-1 of the communicator share node i, so one host can test the placement of
// holders and blocks over several nodes. Nothing when unset.
std::optional<int> ranks_per_node();

// PDTRAIN_TEST_FLIP_FETCH_BIT=v: the fetch client (pd/) flips one bit of the first block it
// receives at parameter version v, so tests can check that corruption is caught and named.
// Nothing when unset.
std::optional<std::int64_t> flip_fetch_bit_at_version();

// The checkpoint writer (ckpt/) calls checkpoint_write_point() on every holder at the named
// points of a commit: "file_created", "params_written", "moments_written", "before_complete",
// "before_rename", "before_latest". A test sets a callback there to kill a writer mid-write;
// an empty function removes it. Thread-safe.
void set_checkpoint_write_hook(std::function<void(std::string_view point)> hook);
void checkpoint_write_point(std::string_view point);

// PDTRAIN_TEST_STALL=<world rank>:<point>[:<n>]: that rank stops the n-th time (default: the
// first) it reaches stall_point(point) and sleeps until the job is ended, as a rank whose GPU or
// process hangs would: its peers' waits on it must end the job (the NCCL collectives'
// failed-peer check and watchdog). Points: "dp_reduce" (GradReducer, before a data-parallel
// reduce on the device: once a step in the baseline, once a unit under PD). Nothing when unset.
void stall_point(std::string_view point);

}  // namespace pdtrain::test_hooks
