// The emulated NCCL (emulation/cuda/src/nccl.cpp): communicators made over MPI as pdtrain makes
// them, collectives whose sums add in rank order with the same bits on every rank and every
// run, point-to-point groups that cannot deadlock, work queued in stream order, arguments
// refused as NCCL refuses them, and a silent or aborted peer that ends the work with an error
// instead of a hang. An MPI test: run with 4 ranks (it runs with 2 or more; the checks over two
// pairs at once need 4). Every rank needs GPUs of its own (NCCL refuses two ranks of one
// communicator on one GPU) and the fault checks spare ones (a fault is sticky on its device):
// PDTRAIN_CUDA_EMU_GPUS must be at least 3 x ranks; it is set to 16 when unset.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <mpi.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

const bool kGpusSet = [] { return setenv("PDTRAIN_CUDA_EMU_GPUS", "16", 0) == 0; }();

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// Rank r's GPU for ordinary checks is r; the fault checks use size + r and 2 size + r.
int own_gpu() { return world_rank(); }
int spare_gpu(int which) { return (1 + which) * world_size() + world_rank(); }

std::string last_error() { return ncclGetLastError(nullptr); }

// An NCCL communicator over the processes of `members` (an MPI communicator), made as pdtrain
// makes one: the id on the first member, broadcast over the members, then ncclCommInitRank on
// each with its rank (by default its rank in `members`) on the current GPU.
ncclResult_t init_over(MPI_Comm members, ncclComm_t* comm, int rank = -1, int nranks = -1) {
  int r = 0, n = 0;
  MPI_Comm_rank(members, &r);
  MPI_Comm_size(members, &n);
  ncclUniqueId id{};
  if (r == 0) {
    EXPECT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  }
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, members);
  return ncclCommInitRank(comm, nranks < 0 ? n : nranks, id, rank < 0 ? r : rank);
}

ncclComm_t world_comm() {
  EXPECT_EQ(cudaSetDevice(own_gpu()), cudaSuccess);
  ncclComm_t comm = nullptr;
  EXPECT_EQ(init_over(MPI_COMM_WORLD, &comm), ncclSuccess) << last_error();
  return comm;
}

class Stream {
 public:
  Stream() { EXPECT_EQ(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), cudaSuccess); }
  ~Stream() { cudaStreamDestroy(s_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  operator cudaStream_t() const { return s_; }
  cudaError_t sync() const { return cudaStreamSynchronize(s_); }

 private:
  cudaStream_t s_ = nullptr;
};

template <class T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t n) : n_(n) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&p_), std::max<std::size_t>(n, 1) * sizeof(T)),
              cudaSuccess);
  }
  explicit DeviceBuffer(const std::vector<T>& v) : DeviceBuffer(v.size()) { put(v); }
  ~DeviceBuffer() { cudaFree(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* get() const { return p_; }
  void put(const std::vector<T>& v) {
    EXPECT_EQ(cudaMemcpy(p_, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<T> read(std::size_t n) const {
    std::vector<T> v(n);
    EXPECT_EQ(cudaMemcpy(v.data(), p_, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
  std::vector<T> read() const { return read(n_); }

 private:
  T* p_ = nullptr;
  std::size_t n_;
};

// Test data: floats of wide-ranging magnitudes and both signs, so that the order of additions
// shows in the bits.
std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
float value(int rank, std::size_t i, int salt = 0) {
  const std::uint64_t u = mix(static_cast<std::uint64_t>(rank) * 1000003u + i * 7919u +
                              static_cast<std::uint64_t>(salt) * 104729u);
  const float mantissa = 1.0f + static_cast<float>(u & 0xffffffu) / 16777216.0f;
  const int exponent = static_cast<int>((u >> 24) % 21) - 10;
  return ((u >> 40) & 1u ? -1.0f : 1.0f) * std::ldexp(mantissa, exponent);
}
std::vector<float> values(int rank, std::size_t n, int salt = 0, std::size_t first = 0) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = value(rank, first + i, salt);
  return v;
}

std::vector<std::uint32_t> bits(const std::vector<float>& v) {
  std::vector<std::uint32_t> b(v.size());
  if (!v.empty()) std::memcpy(b.data(), v.data(), v.size() * sizeof(float));
  return b;
}

// ((x[order[0]] + x[order[1]]) + x[order[2]]) + ... in float.
std::vector<float> sum_in_order(const std::vector<int>& order, std::size_t n, int salt = 0,
                                std::size_t first = 0) {
  std::vector<float> acc = values(order[0], n, salt, first);
  for (std::size_t k = 1; k < order.size(); ++k) {
    const std::vector<float> x = values(order[k], n, salt, first);
    for (std::size_t i = 0; i < n; ++i) acc[i] += x[i];
  }
  return acc;
}
std::vector<int> ranks_upward(int n) {
  std::vector<int> r(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) r[static_cast<std::size_t>(i)] = i;
  return r;
}

// True when every rank of `comm` passed the same bytes.
bool same_everywhere(const void* p, std::size_t bytes, MPI_Comm comm) {
  std::uint64_t h = 1469598103934665603ull;
  for (std::size_t i = 0; i < bytes; ++i)
    h = (h ^ static_cast<const unsigned char*>(p)[i]) * 1099511628211ull;
  std::uint64_t lo = h, hi = h;
  MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_UINT64_T, MPI_MIN, comm);
  MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_UINT64_T, MPI_MAX, comm);
  return lo == hi;
}

// bf16 and half, written out here so the emulation's own conversions are not checked against
// themselves.
std::uint16_t to_bf16(float f) {  // round to nearest even; finite values only
  std::uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<std::uint16_t>(x >> 16);
}
float from_bf16(std::uint16_t b) {
  const std::uint32_t x = std::uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &x, sizeof f);
  return f;
}
std::uint16_t half_of_int(int k) {  // |k| < 2048: exact
  if (k == 0) return 0;
  const unsigned a = static_cast<unsigned>(std::abs(k));
  const int e = 31 - __builtin_clz(a);
  const unsigned m = (a << (10 - e)) & 0x3ffu;
  return static_cast<std::uint16_t>((k < 0 ? 0x8000u : 0u) | (static_cast<unsigned>(e + 15) << 10) |
                                    m);
}
float from_half(std::uint16_t h) {  // normal numbers and zero
  const int e = (h >> 10) & 0x1f;
  if (e == 0) return 0.0f;
  const float m = 1.0f + static_cast<float>(h & 0x3ffu) / 1024.0f;
  return (h & 0x8000u ? -1.0f : 1.0f) * std::ldexp(m, e - 15);
}

template <class T>
std::vector<T> all_reduce(ncclComm_t comm, const Stream& s, const std::vector<T>& mine,
                          ncclDataType_t type, ncclRedOp_t op) {
  DeviceBuffer<T> in(mine), out(mine.size());
  EXPECT_EQ(ncclAllReduce(in.get(), out.get(), mine.size(), type, op, comm, s), ncclSuccess)
      << last_error();
  EXPECT_EQ(s.sync(), cudaSuccess);
  return out.read();
}

TEST(EmulatedNccl, VersionAndErrorStrings) {
  int v = 0;
  ASSERT_EQ(ncclGetVersion(&v), ncclSuccess);
  EXPECT_EQ(v, NCCL_VERSION_CODE);
  EXPECT_EQ(v, NCCL_VERSION(2, 28, 3));
  EXPECT_EQ(v, 22803);
  EXPECT_EQ(sizeof(ncclUniqueId), 128u);
  EXPECT_STRNE(ncclGetErrorString(ncclInvalidArgument), ncclGetErrorString(ncclSuccess));
  EXPECT_STRNE(ncclGetErrorString(ncclRemoteError), "");
}

TEST(EmulatedNccl, ACommunicatorKnowsItsRanksAndGpu) {
  const int me = world_rank(), n = world_size();
  ncclComm_t comm = world_comm();
  ASSERT_NE(comm, nullptr);
  int count = 0, rank = -1, device = -1;
  ncclResult_t async = ncclInternalError;
  EXPECT_EQ(ncclCommCount(comm, &count), ncclSuccess);
  EXPECT_EQ(ncclCommUserRank(comm, &rank), ncclSuccess);
  EXPECT_EQ(ncclCommCuDevice(comm, &device), ncclSuccess);
  EXPECT_EQ(ncclCommGetAsyncError(comm, &async), ncclSuccess);
  EXPECT_EQ(count, n);
  EXPECT_EQ(rank, me);
  EXPECT_EQ(device, own_gpu());
  EXPECT_EQ(async, ncclSuccess);
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);

  // NCCL ranks in the reverse order of the world's (the id made on world rank 0, NCCL rank
  // n - 1): rank order is NCCL's, and root 0 is world rank n - 1.
  ncclComm_t reversed = nullptr;
  ASSERT_EQ(init_over(MPI_COMM_WORLD, &reversed, n - 1 - me), ncclSuccess) << last_error();
  EXPECT_EQ(ncclCommUserRank(reversed, &rank), ncclSuccess);
  EXPECT_EQ(rank, n - 1 - me);
  Stream s;
  const std::size_t k = 257;
  DeviceBuffer<float> in(values(me, k)), out(k), sum(k);
  EXPECT_EQ(ncclBroadcast(in.get(), out.get(), k, ncclFloat, 0, reversed, s), ncclSuccess);
  EXPECT_EQ(ncclAllReduce(in.get(), sum.get(), k, ncclFloat, ncclSum, reversed, s), ncclSuccess);
  ASSERT_EQ(s.sync(), cudaSuccess);
  EXPECT_EQ(bits(out.read()), bits(values(n - 1, k)));
  std::vector<int> order = ranks_upward(n);
  std::reverse(order.begin(), order.end());  // NCCL rank 0 is world rank n - 1
  EXPECT_EQ(bits(sum.read()), bits(sum_in_order(order, k)));
  EXPECT_EQ(ncclCommDestroy(reversed), ncclSuccess);
}

TEST(EmulatedNccl, AllReduceSumAddsInRankOrderWithTheSameBitsEverywhereAndEveryRun) {
  const int me = world_rank(), n = world_size();
  ncclComm_t comm = world_comm();
  Stream s;
  const std::size_t k = 4099;
  const std::vector<float> expected = sum_in_order(ranks_upward(n), k);
  const std::vector<float> first = all_reduce(comm, s, values(me, k), ncclFloat, ncclSum);
  EXPECT_EQ(bits(first), bits(expected));
  EXPECT_TRUE(same_everywhere(first.data(), first.size() * sizeof(float), MPI_COMM_WORLD));

  // Again, in place: the same bits.
  DeviceBuffer<float> data(values(me, k));
  ASSERT_EQ(ncclAllReduce(data.get(), data.get(), k, ncclFloat, ncclSum, comm, s), ncclSuccess);
  ASSERT_EQ(s.sync(), cudaSuccess);
  EXPECT_EQ(bits(data.read()), bits(first));

  // The data is such that another order gives other bits: the check above means something.
  if (n >= 3) {
    std::vector<int> down = ranks_upward(n);
    std::reverse(down.begin(), down.end());
    EXPECT_NE(bits(sum_in_order(down, k)), bits(expected));
  }
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
}

TEST(EmulatedNccl, AllReduceOtherOperationsAndTypes) {
  const int me = world_rank(), n = world_size();
  ncclComm_t comm = world_comm();
  Stream s;
  const std::size_t k = 301;

  std::vector<float> mx = values(0, k), mn = values(0, k);
  for (int r = 1; r < n; ++r) {
    const std::vector<float> x = values(r, k);
    for (std::size_t i = 0; i < k; ++i) {
      mx[i] = std::max(mx[i], x[i]);
      mn[i] = std::min(mn[i], x[i]);
    }
  }
  EXPECT_EQ(bits(all_reduce(comm, s, values(me, k), ncclFloat, ncclMax)), bits(mx));
  EXPECT_EQ(bits(all_reduce(comm, s, values(me, k), ncclFloat, ncclMin)), bits(mn));

  std::vector<float> avg = sum_in_order(ranks_upward(n), k);
  for (float& a : avg) a /= static_cast<float>(n);
  EXPECT_EQ(bits(all_reduce(comm, s, values(me, k), ncclFloat, ncclAvg)), bits(avg));

  std::vector<double> dmine(k), dsum(k, 0.0);
  for (std::size_t i = 0; i < k; ++i) dmine[i] = static_cast<double>(value(me, i)) * 1e-3 + 1e10;
  for (int r = 0; r < n; ++r)
    for (std::size_t i = 0; i < k; ++i) {
      const double x = static_cast<double>(value(r, i)) * 1e-3 + 1e10;
      dsum[i] = r == 0 ? x : dsum[i] + x;
    }
  EXPECT_EQ(all_reduce(comm, s, dmine, ncclDouble, ncclSum), dsum);

  // Integers wrap.
  std::vector<std::int32_t> imine(k);
  std::vector<std::uint32_t> isum(k, 0), iprod(k, 1);
  for (std::size_t i = 0; i < k; ++i)
    imine[i] = static_cast<std::int32_t>(mix(me * 31 + i) & 0x7fffffff);
  for (int r = 0; r < n; ++r)
    for (std::size_t i = 0; i < k; ++i) {
      const auto x = static_cast<std::uint32_t>(mix(r * 31 + i) & 0x7fffffff);
      isum[i] += x;
      iprod[i] *= x;
    }
  std::vector<std::int32_t> want(k);
  for (std::size_t i = 0; i < k; ++i) want[i] = static_cast<std::int32_t>(isum[i]);
  EXPECT_EQ(all_reduce(comm, s, imine, ncclInt32, ncclSum), want);
  for (std::size_t i = 0; i < k; ++i) want[i] = static_cast<std::int32_t>(iprod[i]);
  EXPECT_EQ(all_reduce(comm, s, imine, ncclInt32, ncclProd), want);
  const std::vector<std::int64_t> lmine(k, std::int64_t{1} << 40 | me);
  std::int64_t lsum = 0;
  for (int r = 0; r < n; ++r) lsum += std::int64_t{1} << 40 | r;
  EXPECT_EQ(all_reduce(comm, s, lmine, ncclInt64, ncclSum), std::vector<std::int64_t>(k, lsum));
  const std::vector<std::uint8_t> bytes_mine(k, static_cast<std::uint8_t>(200 + me));
  std::uint8_t bsum = 0;
  for (int r = 0; r < n; ++r) bsum = static_cast<std::uint8_t>(bsum + 200 + r);
  EXPECT_EQ(all_reduce(comm, s, bytes_mine, ncclUint8, ncclSum),
            std::vector<std::uint8_t>(k, bsum));

  // bf16: widened to float, added in rank order, rounded once at the end.
  std::vector<std::uint16_t> bmine(k), bwant(k);
  std::vector<float> wide(k, 0.0f);
  for (int r = 0; r < n; ++r)
    for (std::size_t i = 0; i < k; ++i) {
      const float x = from_bf16(to_bf16(value(r, i)));
      wide[i] = r == 0 ? x : wide[i] + x;
      if (r == me) bmine[i] = to_bf16(value(r, i));
    }
  for (std::size_t i = 0; i < k; ++i) bwant[i] = to_bf16(wide[i]);
  EXPECT_EQ(all_reduce(comm, s, bmine, ncclBfloat16, ncclSum), bwant);

  // half: small integers, whose sums are exact.
  std::vector<std::uint16_t> hmine(k);
  std::vector<float> hwant(k, 0.0f);
  for (std::size_t i = 0; i < k; ++i) {
    hmine[i] = half_of_int(static_cast<int>(i % 97) - 40 + 3 * me);
    for (int r = 0; r < n; ++r)
      hwant[i] += static_cast<float>(static_cast<int>(i % 97) - 40 + 3 * r);
  }
  const std::vector<std::uint16_t> hgot = all_reduce(comm, s, hmine, ncclHalf, ncclSum);
  for (std::size_t i = 0; i < k; ++i) EXPECT_EQ(from_half(hgot[i]), hwant[i]) << "element " << i;
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
}

// Unequal segments, as pdtrain's reduce_scatter and allgather move them: one ncclReduce or
// ncclBroadcast per segment, rooted at its rank, in one group (a rank may own nothing).
TEST(EmulatedNccl, ReduceAndBroadcastPerSegmentInAGroup) {
  const int me = world_rank(), n = world_size();
  ncclComm_t comm = world_comm();
  Stream s;
  std::vector<std::size_t> counts(static_cast<std::size_t>(n)),
      starts(static_cast<std::size_t>(n), 0);
  for (int r = 0; r < n; ++r)
    counts[static_cast<std::size_t>(r)] = r == 1 ? 0 : 5 + 37 * static_cast<std::size_t>(r);
  for (int r = 1; r < n; ++r) starts[static_cast<std::size_t>(r)] = starts[r - 1] + counts[r - 1];
  const std::size_t total = starts.back() + counts.back(),
                    mine = counts[static_cast<std::size_t>(me)];

  DeviceBuffer<float> data(values(me, total)), sum(mine);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < n; ++r)
    ASSERT_EQ(
        ncclReduce(data.get() + starts[r], sum.get(), counts[r], ncclFloat, ncclSum, r, comm, s),
        ncclSuccess)
        << last_error();
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  ASSERT_EQ(s.sync(), cudaSuccess);
  EXPECT_EQ(bits(sum.read(mine)), bits(sum_in_order(ranks_upward(n), mine, 0, starts[me])));

  // Each rank's segment to every rank; non-roots pass no sendbuff, as pdtrain does.
  DeviceBuffer<float> segment(values(me, mine, 7)), out(total);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < n; ++r)
    ASSERT_EQ(ncclBroadcast(r == me ? segment.get() : nullptr, out.get() + starts[r], counts[r],
                            ncclFloat, r, comm, s),
              ncclSuccess)
        << last_error();
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  ASSERT_EQ(s.sync(), cudaSuccess);
  std::vector<float> gathered;
  for (int r = 0; r < n; ++r) {
    const std::vector<float> seg = values(r, counts[r], 7);
    gathered.insert(gathered.end(), seg.begin(), seg.end());
  }
  EXPECT_EQ(bits(out.read()), bits(gathered));
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
}

TEST(EmulatedNccl, ReduceScatterAndAllGatherWithEqualSegments) {
  const int me = world_rank(), n = world_size();
  const auto un = static_cast<std::size_t>(n), ume = static_cast<std::size_t>(me);
  ncclComm_t comm = world_comm();
  Stream s;
  const std::size_t seg = 123;
  const std::vector<float> want = sum_in_order(ranks_upward(n), seg, 0, ume * seg);

  DeviceBuffer<float> data(values(me, seg * un)), out(seg);
  ASSERT_EQ(ncclReduceScatter(data.get(), out.get(), seg, ncclFloat, ncclSum, comm, s),
            ncclSuccess);
  ASSERT_EQ(s.sync(), cudaSuccess);
  EXPECT_EQ(bits(out.read()), bits(want));
  // In place: recvbuff = sendbuff + rank * recvcount.
  ASSERT_EQ(ncclReduceScatter(data.get(), data.get() + ume * seg, seg, ncclFloat, ncclSum, comm, s),
            ncclSuccess);
  ASSERT_EQ(s.sync(), cudaSuccess);
  const std::vector<float> after = data.read();
  EXPECT_EQ(bits(std::vector<float>(after.begin() + static_cast<long>(ume * seg),
                                    after.begin() + static_cast<long>((ume + 1) * seg))),
            bits(want));

  std::vector<float> gathered;
  for (int r = 0; r < n; ++r) {
    const std::vector<float> v = values(r, seg, 3);
    gathered.insert(gathered.end(), v.begin(), v.end());
  }
  DeviceBuffer<float> part(values(me, seg, 3)), all(seg * un);
  ASSERT_EQ(ncclAllGather(part.get(), all.get(), seg, ncclFloat, comm, s), ncclSuccess);
  ASSERT_EQ(s.sync(), cudaSuccess);
  EXPECT_EQ(bits(all.read()), bits(gathered));
  // In place: sendbuff = recvbuff + rank * sendcount.
  std::vector<float> start(seg * un, -1.0f);
  std::copy_n(values(me, seg, 3).begin(), seg, start.begin() + static_cast<long>(ume * seg));
  DeviceBuffer<float> inplace(start);
  ASSERT_EQ(ncclAllGather(inplace.get() + ume * seg, inplace.get(), seg, ncclFloat, comm, s),
            ncclSuccess);
  ASSERT_EQ(s.sync(), cudaSuccess);
  EXPECT_EQ(bits(inplace.read()), bits(gathered));
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
}

// Every rank sends 4 MiB (past MPI's eager limit) to both neighbours and receives from both,
// and sends to itself, all in one group: posted together, so no send waits on a receive that
// the group has not posted yet. Between two ranks, the k-th send pairs with the k-th receive.
TEST(EmulatedNccl, SendsAndReceivesBothWaysInOneGroup) {
  const int me = world_rank(), n = world_size();
  ncclComm_t comm = world_comm();
  Stream s;
  const std::size_t k = std::size_t{1} << 20;
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  DeviceBuffer<float> a(values(me, k, 1)), b(values(me, k, 2)), c(values(me, 99, 3));
  DeviceBuffer<float> from_prev(k), from_next(k), from_self(99);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclSend(a.get(), k, ncclFloat, next, comm, s), ncclSuccess);
  EXPECT_EQ(ncclSend(b.get(), k, ncclFloat, prev, comm, s), ncclSuccess);
  EXPECT_EQ(ncclRecv(from_prev.get(), k, ncclFloat, prev, comm, s), ncclSuccess);
  EXPECT_EQ(ncclRecv(from_next.get(), k, ncclFloat, next, comm, s), ncclSuccess);
  EXPECT_EQ(ncclSend(c.get(), 99, ncclFloat, me, comm, s), ncclSuccess);
  EXPECT_EQ(ncclRecv(from_self.get(), 99, ncclFloat, me, comm, s), ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  ASSERT_EQ(s.sync(), cudaSuccess);
  EXPECT_EQ(bits(from_prev.read()), bits(values(prev, k, 1)));
  EXPECT_EQ(bits(from_next.read()), bits(values(next, k, 2)));
  EXPECT_EQ(bits(from_self.read()), bits(values(me, 99, 3)));
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
}

// Pairs of world ranks ({0, 1}, {2, 3}, ...) each with a communicator of their own, and the
// world's, all busy at once on different streams.
TEST(EmulatedNccl, CommunicatorsOverDisjointRanksWorkAtOnce) {
  const int me = world_rank(), n = world_size();
  MPI_Comm pair = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, me / 2, me, &pair);
  ASSERT_EQ(cudaSetDevice(own_gpu()), cudaSuccess);
  ncclComm_t pair_comm = nullptr, world = nullptr;
  ASSERT_EQ(init_over(pair, &pair_comm), ncclSuccess) << last_error();
  ASSERT_EQ(init_over(MPI_COMM_WORLD, &world), ncclSuccess) << last_error();
  int pair_size = 0;
  EXPECT_EQ(ncclCommCount(pair_comm, &pair_size), ncclSuccess);
  EXPECT_EQ(pair_size, std::min(2, n - me / 2 * 2));

  Stream s1, s2;
  const std::size_t k = 10007;
  DeviceBuffer<float> mine(values(me, k, 5)), pair_sum(k), world_sum(k);
  for (int round = 0; round < 3; ++round) {
    ASSERT_EQ(ncclAllReduce(mine.get(), pair_sum.get(), k, ncclFloat, ncclSum, pair_comm, s1),
              ncclSuccess);
    ASSERT_EQ(ncclAllReduce(mine.get(), world_sum.get(), k, ncclFloat, ncclSum, world, s2),
              ncclSuccess);
  }
  ASSERT_EQ(s1.sync(), cudaSuccess);
  ASSERT_EQ(s2.sync(), cudaSuccess);
  std::vector<int> members = {me / 2 * 2};
  if (members[0] + 1 < n) members.push_back(members[0] + 1);
  EXPECT_EQ(bits(pair_sum.read()), bits(sum_in_order(members, k, 5)));
  EXPECT_EQ(bits(world_sum.read()), bits(sum_in_order(ranks_upward(n), k, 5)));
  EXPECT_EQ(ncclCommDestroy(pair_comm), ncclSuccess);
  EXPECT_EQ(ncclCommDestroy(world), ncclSuccess);
  MPI_Comm_free(&pair);
}

// The all-reduce runs after the work queued before it on its stream: a host function that
// sleeps and then writes the value, copied to the device; the host never waits for it.
TEST(EmulatedNccl, RunsInStreamOrder) {
  const int me = world_rank(), n = world_size();
  ncclComm_t comm = world_comm();
  Stream s;
  const std::size_t k = 64;
  const int rounds = 4;
  struct Round {
    float* pinned;
    float value;
    std::size_t k;
  };
  float *pinned_in = nullptr, *pinned_out = nullptr;
  ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&pinned_in), k * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&pinned_out), rounds * k * sizeof(float)),
            cudaSuccess);
  std::fill_n(pinned_in, k, -1.0f);
  DeviceBuffer<float> d(k);
  std::vector<Round> round(rounds);
  for (int i = 0; i < rounds; ++i) {
    round[i] = {pinned_in, value(me, static_cast<std::size_t>(i), 9), k};
    ASSERT_EQ(cudaLaunchHostFunc(
                  s,
                  [](void* p) {
                    const Round& r = *static_cast<const Round*>(p);
                    std::this_thread::sleep_for(std::chrono::milliseconds(50));
                    std::fill_n(r.pinned, r.k, r.value);
                  },
                  &round[i]),
              cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(d.get(), pinned_in, k * sizeof(float), cudaMemcpyHostToDevice, s),
              cudaSuccess);
    ASSERT_EQ(ncclAllReduce(d.get(), d.get(), k, ncclFloat, ncclSum, comm, s), ncclSuccess);
    ASSERT_EQ(
        cudaMemcpyAsync(pinned_out + i * k, d.get(), k * sizeof(float), cudaMemcpyDeviceToHost, s),
        cudaSuccess);
  }
  ASSERT_EQ(s.sync(), cudaSuccess);
  for (int i = 0; i < rounds; ++i) {
    float want = value(0, static_cast<std::size_t>(i), 9);
    for (int r = 1; r < n; ++r) want += value(r, static_cast<std::size_t>(i), 9);
    for (std::size_t j = 0; j < k; ++j) ASSERT_EQ(pinned_out[i * k + j], want) << "round " << i;
  }

  // Queued, not run: rank 0's call returns before any other rank has made its own (they wait
  // for rank 0's message, sent after its call returned).
  MPI_Comm tokens;
  MPI_Comm_dup(MPI_COMM_WORLD, &tokens);
  DeviceBuffer<float> x(values(me, k));
  if (me == 0) {
    ASSERT_EQ(ncclAllReduce(x.get(), x.get(), k, ncclFloat, ncclSum, comm, s), ncclSuccess);
    int token = 1;
    for (int r = 1; r < n; ++r) MPI_Send(&token, 1, MPI_INT, r, 0, tokens);
  } else {
    int token = 0;
    MPI_Recv(&token, 1, MPI_INT, 0, 0, tokens, MPI_STATUS_IGNORE);
    ASSERT_EQ(ncclAllReduce(x.get(), x.get(), k, ncclFloat, ncclSum, comm, s), ncclSuccess);
  }
  ASSERT_EQ(s.sync(), cudaSuccess);
  EXPECT_EQ(bits(x.read()), bits(sum_in_order(ranks_upward(n), k)));
  MPI_Comm_free(&tokens);
  cudaFreeHost(pinned_in);
  cudaFreeHost(pinned_out);
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
}

TEST(EmulatedNccl, DestroyWaitsForQueuedWork) {
  const int me = world_rank(), n = world_size();
  ncclComm_t comm = world_comm();
  Stream s;
  const std::size_t k = 1 << 16;
  DeviceBuffer<float> x(values(me, k));
  ASSERT_EQ(ncclAllReduce(x.get(), x.get(), k, ncclFloat, ncclSum, comm, s), ncclSuccess);
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
  ASSERT_EQ(s.sync(), cudaSuccess);
  EXPECT_EQ(bits(x.read()), bits(sum_in_order(ranks_upward(n), k)));
}

TEST(EmulatedNccl, RefusesInvalidArguments) {
  const int me = world_rank(), n = world_size();
  ncclComm_t comm = world_comm();
  Stream s;
  DeviceBuffer<float> d(std::vector<float>(16, 1.0f));
  std::vector<float> host(16, 1.0f);
  const auto refused = [&](ncclResult_t got, ncclResult_t want, const char* says) {
    EXPECT_EQ(got, want);
    EXPECT_NE(last_error().find(says), std::string::npos) << last_error();
  };
  refused(ncclAllReduce(host.data(), d.get(), 16, ncclFloat, ncclSum, comm, s), ncclInvalidArgument,
          "pageable host memory");
  refused(ncclAllReduce(d.get(), host.data(), 16, ncclFloat, ncclSum, comm, s), ncclInvalidArgument,
          "recvbuff");
  refused(ncclSend(host.data(), 16, ncclFloat, 0, comm, s), ncclInvalidArgument,
          "pageable host memory");
  refused(ncclAllReduce(d.get(), d.get(), 17, ncclFloat, ncclSum, comm, s), ncclInvalidArgument,
          "past the end of its allocation");
  refused(ncclAllGather(d.get(), d.get(), 16 / static_cast<std::size_t>(n) + 1, ncclFloat, comm, s),
          ncclInvalidArgument, "past the end");
  refused(ncclBroadcast(d.get(), d.get(), 4, ncclFloat, n, comm, s), ncclInvalidArgument, "root");
  refused(ncclReduce(d.get(), d.get(), 4, ncclFloat, ncclSum, -1, comm, s), ncclInvalidArgument,
          "root");
  refused(ncclSend(d.get(), 4, ncclFloat, -1, comm, s), ncclInvalidArgument, "peer");
  refused(ncclRecv(d.get(), 4, ncclFloat, n, comm, s), ncclInvalidArgument, "peer");
  refused(ncclAllReduce(d.get(), d.get(), 4, ncclFloat8e4m3, ncclSum, comm, s), ncclInvalidArgument,
          "not supported");
  refused(ncclAllReduce(d.get(), d.get(), 4, static_cast<ncclDataType_t>(99), ncclSum, comm, s),
          ncclInvalidArgument, "datatype");
  refused(ncclAllReduce(d.get(), d.get(), 4, ncclFloat, static_cast<ncclRedOp_t>(17), comm, s),
          ncclInvalidArgument, "op");
  refused(ncclAllReduce(d.get(), d.get(), 4, ncclFloat, ncclSum, nullptr, s), ncclInvalidArgument,
          "comm is NULL");
  // Device memory of another GPU.
  ASSERT_EQ(cudaSetDevice(spare_gpu(1)), cudaSuccess);
  float* other = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&other), 16 * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(own_gpu()), cudaSuccess);
  refused(ncclAllReduce(other, d.get(), 16, ncclFloat, ncclSum, comm, s), ncclInvalidArgument,
          "device memory of GPU");
  cudaFree(other);

  // A refused call inside a group: the group ends with its error and queues nothing.
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclAllReduce(d.get(), d.get(), 16, ncclFloat, ncclSum, comm, s), ncclSuccess);
  EXPECT_EQ(ncclAllReduce(host.data(), d.get(), 16, ncclFloat, ncclSum, comm, s),
            ncclInvalidArgument);
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidArgument);
  ASSERT_EQ(s.sync(), cudaSuccess);
  EXPECT_EQ(d.read(), std::vector<float>(16, 1.0f));
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);  // no group to end
  // The communicator still works.
  ASSERT_EQ(ncclAllReduce(d.get(), d.get(), 16, ncclFloat, ncclSum, comm, s), ncclSuccess);
  ASSERT_EQ(s.sync(), cudaSuccess);
  EXPECT_EQ(d.read(), std::vector<float>(16, static_cast<float>(n)));
  ncclResult_t async = ncclInternalError;
  EXPECT_EQ(ncclCommGetAsyncError(comm, &async), ncclSuccess);
  EXPECT_EQ(async, ncclSuccess);
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);

  // ncclCommInitRank refuses bad ranks and ids before talking to anyone.
  ncclUniqueId id{};
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t c = reinterpret_cast<ncclComm_t>(&id);
  refused(ncclCommInitRank(&c, n, id, n), ncclInvalidArgument, "rank");
  EXPECT_EQ(c, nullptr);
  refused(ncclCommInitRank(&c, n, id, -1), ncclInvalidArgument, "rank");
  refused(ncclCommInitRank(&c, 0, id, 0), ncclInvalidArgument, "nranks");
  refused(ncclCommInitRank(&c, n + 1, id, 0), ncclInvalidArgument, "nranks");
  ncclUniqueId garbage;
  std::memset(&garbage, 0xab, sizeof garbage);
  refused(ncclCommInitRank(&c, n, garbage, me), ncclInvalidArgument, "not made by ncclGetUniqueId");
  ncclUniqueId zero{};
  refused(ncclCommInitRank(&c, n, zero, me), ncclInvalidArgument, "broadcast");
  ncclUniqueId forged = id;
  const std::uint64_t never = std::uint64_t{1} << 60;  // bytes 16..23: the emulation's id number
  std::memcpy(forged.internal + 16, &never, sizeof never);
  refused(ncclCommInitRank(&c, n, forged, me), ncclInvalidArgument, "never made");
}

// The creator checks what the members pass: ranks 0 and 1 of the world, the others wait.
TEST(EmulatedNccl, CommInitChecksTheMembers) {
  const int me = world_rank();
  MPI_Comm two = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, me < 2 ? 0 : MPI_UNDEFINED, me, &two);
  if (two != MPI_COMM_NULL) {
    ASSERT_EQ(cudaSetDevice(own_gpu()), cudaSuccess);
    ncclComm_t c = nullptr;
    if (world_size() >= 3) {  // nranks=3 must be possible for the second rank to pass it
      EXPECT_EQ(init_over(two, &c, me, me == 0 ? 2 : 3), ncclInvalidArgument);
      EXPECT_EQ(c, nullptr);
      EXPECT_NE(last_error().find("nranks=2"), std::string::npos) << last_error();
      EXPECT_NE(last_error().find("nranks=3"), std::string::npos) << last_error();
    }

    EXPECT_EQ(init_over(two, &c, 0), ncclInvalidArgument);
    EXPECT_NE(last_error().find("rank 0 is claimed"), std::string::npos) << last_error();

    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);  // both ranks on GPU 0
    EXPECT_EQ(init_over(two, &c), ncclInvalidUsage);
    EXPECT_NE(last_error().find("Duplicate GPU"), std::string::npos) << last_error();
    ASSERT_EQ(cudaSetDevice(own_gpu()), cudaSuccess);

    // And then a good one.
    ASSERT_EQ(init_over(two, &c), ncclSuccess) << last_error();
    EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
    MPI_Comm_free(&two);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// A pending receive whose peer never sends ends with an error, through the timeout (pair 0) or
// through ncclCommAbort (pair 1, or pair 0 again on fewer than 4 ranks), within seconds; the
// stream's device faults. On spare GPUs: a fault is sticky.
void silent_peer(bool abort, int gpu) {
  const int me = world_rank(), n = world_size();
  const int pair_index = abort && n >= 4 ? 1 : 0;
  const int first = 2 * pair_index;
  MPI_Comm pair = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, me == first || me == first + 1 ? 0 : MPI_UNDEFINED, me, &pair);
  if (pair == MPI_COMM_NULL) return;
  ASSERT_EQ(cudaSetDevice(gpu), cudaSuccess);
  if (!abort) setenv("PDTRAIN_CUDA_EMU_NCCL_TIMEOUT", "2", 1);  // read by ncclCommInitRank
  ncclComm_t comm = nullptr;
  const ncclResult_t made = init_over(pair, &comm);
  unsetenv("PDTRAIN_CUDA_EMU_NCCL_TIMEOUT");
  ASSERT_EQ(made, ncclSuccess) << last_error();
  const auto t0 = std::chrono::steady_clock::now();
  const auto seconds = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  if (me == first) {
    Stream s;
    DeviceBuffer<float> d(16);
    ASSERT_EQ(ncclRecv(d.get(), 16, ncclFloat, 1, comm, s), ncclSuccess);
    ncclResult_t async = ncclInternalError;
    ASSERT_EQ(ncclCommGetAsyncError(comm, &async), ncclSuccess);
    EXPECT_EQ(async, ncclSuccess);  // still waiting
    if (abort) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      EXPECT_EQ(cudaStreamQuery(s), cudaErrorNotReady);
      EXPECT_EQ(ncclCommAbort(comm), ncclSuccess);
      EXPECT_LT(seconds(), 10.0);
      EXPECT_EQ(s.sync(), cudaErrorLaunchFailure);
      EXPECT_NE(last_error().find("aborted"), std::string::npos) << last_error();
    } else {
      while (async == ncclSuccess && seconds() < 30.0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        ASSERT_EQ(ncclCommGetAsyncError(comm, &async), ncclSuccess);
      }
      EXPECT_EQ(async, ncclRemoteError);
      EXPECT_GE(seconds(), 1.5);
      EXPECT_EQ(s.sync(), cudaErrorLaunchFailure);
      EXPECT_NE(last_error().find("ncclRecv"), std::string::npos) << last_error();
      EXPECT_NE(last_error().find("receive 64 bytes from rank 1 (world rank " +
                                  std::to_string(first + 1)),
                std::string::npos)
          << last_error();
      // A broken communicator refuses new work with its error.
      EXPECT_EQ(ncclRecv(d.get(), 16, ncclFloat, 1, comm, s), ncclRemoteError);
      EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
    }
  } else {
    // The silent peer: its own communicator and device are fine.
    ncclResult_t async = ncclInternalError;
    EXPECT_EQ(ncclCommGetAsyncError(comm, &async), ncclSuccess);
    EXPECT_EQ(async, ncclSuccess);
    EXPECT_EQ(abort ? ncclCommAbort(comm) : ncclCommDestroy(comm), ncclSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  MPI_Comm_free(&pair);
}

TEST(EmulatedNccl, ASilentPeerEndsTheWorkWithAnErrorNotAHang) {
  silent_peer(false, spare_gpu(0));
  silent_peer(true, world_size() >= 4 ? spare_gpu(0) : spare_gpu(1));
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
