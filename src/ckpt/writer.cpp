// CheckpointWriter: encoding (pure, any thread) and the collective HDF5 commit (caller's
// thread). See checkpoint.hpp for the contract and docs/checkpoint-format.md for the file.
//
// Why the asynchronous path looks like this: the holders' communicator is busy in the main
// thread (the server loop), Open MPI is initialized without MPI_THREAD_MULTIPLE, and Debian's
// parallel HDF5 is not thread-safe. So the background thread only does what needs neither MPI
// nor HDF5 -- CRCs, xor/bitdelta encoding, shuffle and zstd compression of whole-block chunks
// into memory -- and the collective file write runs later in the caller's thread, at poll() or
// wait(), where HDF5's zstd filter copies the prepared frames instead of compressing.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>

#include "comm.hpp"
#include "files.hpp"
#include "format.hpp"
#include "geometry.hpp"
#include "h5_util.hpp"
#include "pdtrain/ckpt/canonical_crc.hpp"
#include "pdtrain/ckpt/checkpoint.hpp"
#include "pdtrain/ckpt/zstd_filter.hpp"
#include "pdtrain/core/agreement.hpp"
#include "pdtrain/core/crc32c.hpp"
#include "pdtrain/core/mpi_check.hpp"
#include "pdtrain/core/test_hooks.hpp"
#include "pdtrain/core/timer.hpp"
#include "pdtrain/io/output_file.hpp"
#include "precompress.hpp"

namespace pdtrain::ckpt {

using detail::TensorGeom;

// This holder's blocks of the last anchor, as written: the base of xor and bitdelta deltas.
struct CheckpointWriter::Anchor {
  std::string file;
  std::uint32_t params_crc = 0;
  std::map<int, BlockState> blocks;
};

namespace {

std::vector<std::uint32_t> bits_of(const std::vector<float>& v) {
  std::vector<std::uint32_t> out(v.size());
  if (!v.empty()) std::memcpy(out.data(), v.data(), v.size() * sizeof(float));
  return out;
}

std::uint32_t crc_of(const std::vector<float>& v) {
  return crc32c(v.data(), v.size() * sizeof(float));
}

// One block as it goes into the file.
struct EncodedBlock {
  const BlockInfo* info = nullptr;
  std::vector<std::uint32_t> state[3];   // fp32 bits or xor bits; empty where quantized
  std::vector<std::uint8_t> codes[3];    // quantized states: codes, padded to the tensor's row
  std::vector<std::uint32_t> scales[3];  // quantized states: scale pairs, padded likewise
  float max_error[3] = {0, 0, 0};        // quantized states: the decode's largest error
  std::uint32_t crc[3] = {0, 0, 0};      // of the decoded fp32 data
};

}  // namespace

struct CheckpointWriter::Job {
  // What to write.
  std::int64_t step = 0, version = 0, tokens = 0;
  std::string deck, layout, path, tmp;
  bool anchor = false;
  Codec file_codec = Codec::raw;
  BitDeltaBits bits;                     // of a bitdelta file
  std::shared_ptr<const Anchor> base;    // deltas: the anchor they refer to
  std::map<int, BlockState> snapshot;    // this holder's state at write time

  // What encoding produced.
  std::vector<EncodedBlock> blocks;      // by id
  std::vector<CrcPiece> pieces;          // canonical-CRC pieces of the decoded params
  std::shared_ptr<Anchor> new_anchor;    // anchors of delta codecs: the snapshot itself
  detail::PrecompressedChunks chunks;    // async: frames compressed in the background
  double encode_seconds = 0;
  std::unique_ptr<Error> error;          // an encoding failure, reported at commit

  std::thread worker;
  std::atomic<bool> done{false};
};

// What every holder must know alike before the collective write.
struct CheckpointWriter::Agreed {
  std::vector<TensorGeom> geom;                     // of the model's tensors
  std::vector<std::uint32_t> crc[3], max_error[3];  // per block, every holder's merged
  std::int64_t raw_bytes = 0;                       // all holders' state, unencoded
  std::uint32_t params_crc = 0;                     // canonical CRC of the decoded parameters
  std::vector<std::uint32_t> calls;                 // H5Dwrite calls per tensor (FileWriter)
};

namespace {

using Job = CheckpointWriter::Job;
using Agreed = CheckpointWriter::Agreed;

// ---------------------------------------------------------------- encoding (no MPI, no HDF5)

void encode_block(const BlockInfo& b, const BlockState& s, const BlockState* base, Codec codec,
                  const BitDeltaBits& bits, const TensorGeom& g, EncodedBlock& e,
                  std::vector<float>& decoded) {
  e.info = &b;
  const std::vector<float>* values[3] = {&s.param, &s.m, &s.v};
  for (const std::vector<float>* v : values)
    if (v->size() != static_cast<std::size_t>(b.numel()))
      throw Error(ExitCode::runtime, "checkpoint: block " + std::to_string(b.id) + " has " +
                                         std::to_string(v->size()) + " values, expected " +
                                         std::to_string(b.numel()));
  const std::size_t n = s.param.size();
  std::vector<float> lossy(n);
  const std::vector<float>* refs[3] = {base ? &base->param : nullptr, base ? &base->m : nullptr,
                                       base ? &base->v : nullptr};
  for (int k = 0; k < 3; ++k) {
    const std::vector<float>& x = *values[k];
    const std::vector<float>* ref = refs[k];
    if (const auto sq = state_quant(codec, bits, k)) {
      e.codes[k].assign(g.code_row(sq->bits), 0);
      e.scales[k].assign(g.scale_row(), 0);
      e.max_error[k] = quantize(sq->q, sq->bits, x.data(), ref ? ref->data() : nullptr, n,
                                e.codes[k].data(), e.scales[k].data(), lossy.data());
      e.crc[k] = crc_of(lossy);  // of what a reader will decode, so lossy states verify too
      if (k == 0) decoded = lossy;
      continue;
    }
    e.state[k] = bits_of(x);
    e.crc[k] = crc_of(x);
    if (k == 0) decoded = x;
    if (is_delta(codec)) {
      const std::vector<std::uint32_t> rb = bits_of(*ref);
      xor_bits(e.state[k].data(), rb.data(), e.state[k].data(), n);
    }
  }
}

// `precompress`: also compress every chunk that is exactly one block, for the zstd filter to
// pick up during the commit. `keep_anchor`: the snapshot becomes the in-memory anchor.
void encode(Job& j, const ParamCatalog& catalog, const std::vector<TensorGeom>& geom, int level,
            bool precompress, bool keep_anchor) {
  const double t0 = now_seconds();
  try {
    std::vector<float> decoded;
    j.blocks.resize(j.snapshot.size());
    std::size_t i = 0;
    for (const auto& [id, s] : j.snapshot) {
      if (id < 0 || id >= static_cast<int>(catalog.blocks().size()))
        throw Error(ExitCode::runtime, "checkpoint: no block " + std::to_string(id));
      const BlockInfo& b = catalog.block(id);
      const BlockState* base = nullptr;
      if (j.base) {
        auto it = j.base->blocks.find(id);
        if (it == j.base->blocks.end())
          throw Error(ExitCode::runtime, "checkpoint: block " + catalog.block_name(b) +
                                             " is not in this holder's anchor");
        base = &it->second;
      }
      encode_block(b, s, base, j.file_codec, j.bits, geom[static_cast<int>(b.tensor)],
                   j.blocks[i++], decoded);
      append_crc_pieces(catalog, b, decoded.data(), j.pieces);
    }
    if (precompress && j.file_codec != Codec::raw) {
      for (const EncodedBlock& e : j.blocks) {
        if (detail::block_is_chunk(geom[static_cast<int>(e.info->tensor)], *e.info))
          for (const auto& st : e.state)
            if (!st.empty()) j.chunks.add(st.data(), st.size() * 4, 4, level);
        for (int k = 0; k < 3; ++k) {  // bitdelta rows: one chunk per block whatever its shape
          if (!e.codes[k].empty()) j.chunks.add(e.codes[k].data(), e.codes[k].size(), 1, level);
          if (!e.scales[k].empty())
            j.chunks.add(e.scales[k].data(), e.scales[k].size() * 4, 4, level);
        }
      }
    }
    if (keep_anchor) {
      j.new_anchor = std::make_shared<CheckpointWriter::Anchor>();
      j.new_anchor->blocks = std::move(j.snapshot);
    }
    j.snapshot.clear();
  } catch (const Error& e) {
    j.error = std::make_unique<Error>(e);
  } catch (const std::exception& e) {
    j.error = std::make_unique<Error>(ExitCode::runtime, std::string("checkpoint: ") + e.what());
  }
  j.encode_seconds = now_seconds() - t0;
}

// ---------------------------------------------------------------- the HDF5 file (caller's thread)

using TensorBlocks = std::map<int, std::vector<const EncodedBlock*>>;  // tensor -> its blocks

class FileWriter {
 public:
  // calls[t] (calls[T + t] for bitdelta's per-block rows): how many H5Dwrite calls the holder
  // with the most boxes of tensor t needs; every holder makes that many (collective calls
  // must match).
  FileWriter(const Job& job, const std::vector<TensorGeom>& geom, std::vector<std::uint32_t> calls,
             int level, MPI_Comm comm, int rank, int size)
      : job_(job), geom_(geom), calls_(std::move(calls)), level_(level), rank_(rank) {
    for (const EncodedBlock& e : job.blocks)
      by_tensor_[static_cast<int>(e.info->tensor)].push_back(&e);
    H5Context ctx(job.tmp, "");
    H5Id fapl(H5_CHECK(H5Pcreate(H5P_FILE_ACCESS)));
    // Closing the file must really close it (it is fsync'ed and renamed next): an object left
    // open makes H5Fclose fail instead of silently keeping the file open.
    H5_CHECK(H5Pset_fclose_degree(fapl, H5F_CLOSE_SEMI));
    // bitdelta files (format version 2) hold ~100 small chunked datasets; HDF5 1.10's own
    // file format indexes their chunks with fixed arrays instead of 1.8's version-1 B-trees,
    // whose nodes would be a tenth of a small model's file. Other codecs keep their format.
    if (job.file_codec == Codec::bitdelta)
      H5_CHECK(H5Pset_libver_bounds(fapl, H5F_LIBVER_V110, H5F_LIBVER_V110));
    dxpl_ = H5Id(H5_CHECK(H5Pcreate(H5P_DATASET_XFER)));
    if (size > 1) {
      // Parallel writes through filters must be collective.
      H5_CHECK(H5Pset_fapl_mpio(fapl, comm, MPI_INFO_NULL));
      H5_CHECK(H5Pset_all_coll_metadata_ops(fapl, true));
      H5_CHECK(H5Pset_coll_metadata_write(fapl, true));
      H5_CHECK(H5Pset_dxpl_mpio(dxpl_, H5FD_MPIO_COLLECTIVE));
    }
    file_ = H5Id(H5_CHECK(H5Fcreate(job.tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl)));
  }

  hid_t file() const { return file_; }

  void write_state(int k) {
    const char* group_name = detail::kStateGroups[k];
    H5Id group(H5_CHECK(H5Gcreate2(file_, group_name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)));
    const bool xored = is_delta(job_.file_codec);  // quantized states are not written here
    for (const TensorGeom& g : geom_) {
      H5Context ctx(job_.tmp, std::string(group_name) + "/" + g.name());
      H5Id space(H5_CHECK(H5Screate_simple(g.rank, g.dims, nullptr)));
      H5Id p = dcpl(g.chunk, g.rank, true);
      H5Id dset(H5_CHECK(H5Dcreate2(group, g.name().c_str(),
                                    xored ? H5T_STD_U32LE : H5T_IEEE_F32LE, space, H5P_DEFAULT,
                                    p, H5P_DEFAULT)));
      detail::PrecompressedChunks::Counting counting;  // from the write to the close
      write_tensor(dset, xored ? H5T_NATIVE_UINT32 : H5T_NATIVE_FLOAT, g, blocks_of(g), k);
      dset.close_checked(__FILE__, __LINE__);
    }
  }

  // A quantized state k of a bitdelta file: per tensor, its codes (uint8) and its scale pairs
  // (uint32, shuffled), each [blocks of the tensor, row width], one chunk per block.
  void write_quantized(int k) {
    const std::string state = detail::kStateGroups[k];
    const int bits = state_quant(job_.file_codec, job_.bits, k)->bits;
    write_rows<std::uint8_t>(
        state + detail::kCodesSuffix, H5T_STD_U8LE, H5T_NATIVE_UINT8, false,
        [bits](const TensorGeom& g) { return g.code_row(bits); },
        [k](const EncodedBlock& e) -> const std::vector<std::uint8_t>& { return e.codes[k]; });
    write_rows<std::uint32_t>(
        state + detail::kScalesSuffix, H5T_STD_U32LE, H5T_NATIVE_UINT32, true,
        [](const TensorGeom& g) { return g.scale_row(); },
        [k](const EncodedBlock& e) -> const std::vector<std::uint32_t>& { return e.scales[k]; });
  }

  // A small 1-D dataset every holder knows in full (CRCs, error bounds); holder 0 writes it.
  void write_small(hid_t loc, const std::string& name, hid_t file_type, hid_t mem_type,
                   const void* data, std::size_t n) {
    H5Context ctx(job_.tmp, name);
    const hsize_t dims = n;
    H5Id space(H5_CHECK(H5Screate_simple(1, &dims, nullptr)));
    H5Id dset(H5_CHECK(H5Dcreate2(loc, name.c_str(), file_type, space, H5P_DEFAULT, H5P_DEFAULT,
                                  H5P_DEFAULT)));
    if (rank_ != 0) H5_CHECK(H5Sselect_none(space));
    write_selection(dset, mem_type, space, data, rank_ == 0 ? n : 0);
  }

  void close() {
    H5Context ctx(job_.tmp, "");
    file_.close_checked(__FILE__, __LINE__);
  }

 private:
  H5Id dcpl(const hsize_t* chunk, int rank, bool shuffle) const {
    H5Id p(H5_CHECK(H5Pcreate(H5P_DATASET_CREATE)));
    H5_CHECK(H5Pset_chunk(p, rank, chunk));
    // Every element gets written, and parallel HDF5 allocates all chunks when the dataset is
    // created: writing fill values there would be a second pass over the file.
    H5_CHECK(H5Pset_fill_time(p, H5D_FILL_TIME_NEVER));
    if (job_.file_codec != Codec::raw) {
      if (shuffle) H5_CHECK(H5Pset_shuffle(p));
      const unsigned cd[1] = {static_cast<unsigned>(level_)};
      H5_CHECK(H5Pset_filter(p, kZstdFilterId, H5Z_FLAG_MANDATORY, 1, cd));
    }
    return p;
  }

  // One dataset per tensor in group `group_name`, [blocks of the tensor, width(g)], a row per
  // block (row(e): exactly width(g) elements), written box by box of consecutive blocks.
  template <class T, class Width, class Row>
  void write_rows(const std::string& group_name, hid_t file_type, hid_t mem_type, bool shuffle,
                  Width width, Row row) {
    H5Id group(H5_CHECK(H5Gcreate2(file_, group_name.c_str(), H5P_DEFAULT, H5P_DEFAULT,
                                   H5P_DEFAULT)));
    for (const TensorGeom& g : geom_) {
      H5Context ctx(job_.tmp, group_name + "/" + g.name());
      const hsize_t dims[2] = {static_cast<hsize_t>(g.n_blocks), width(g)};
      const hsize_t chunk[2] = {1, width(g)};
      H5Id space(H5_CHECK(H5Screate_simple(2, dims, nullptr)));
      H5Id p = dcpl(chunk, 2, shuffle);
      H5Id dset(H5_CHECK(H5Dcreate2(group, g.name().c_str(), file_type, space, H5P_DEFAULT, p,
                                    H5P_DEFAULT)));
      std::map<int, const EncodedBlock*> by_id;
      std::vector<const BlockInfo*> infos;
      for (const EncodedBlock* e : blocks_of(g)) {
        by_id[e->info->id] = e;
        infos.push_back(e->info);
      }
      const std::vector<detail::Box> boxes = detail::row_boxes_of(g, infos, width(g));
      detail::PrecompressedChunks::Counting counting;
      const std::uint32_t calls = calls_[geom_.size() + static_cast<std::size_t>(g.info->id)];
      for (std::uint32_t c = 0; c < calls; ++c) {
        std::vector<T> buf;
        if (c < boxes.size()) {
          detail::select_box(space, boxes[c]);
          for (const BlockInfo* b : boxes[c].blocks) {  // by id: the box's row order
            const std::vector<T>& r = row(*by_id[b->id]);
            buf.insert(buf.end(), r.begin(), r.end());
          }
        } else {
          H5_CHECK(H5Sselect_none(space));
        }
        write_selection(dset, mem_type, space, buf.data(), buf.size());
      }
      dset.close_checked(__FILE__, __LINE__);
    }
  }

  std::vector<const EncodedBlock*> blocks_of(const TensorGeom& g) const {
    auto it = by_tensor_.find(static_cast<int>(g.info->id));
    return it == by_tensor_.end() ? std::vector<const EncodedBlock*>{} : it->second;
  }

  // One H5Dwrite per box of this holder's blocks of the tensor, each buffer laid out in the
  // box's row-major order.
  void write_tensor(hid_t dset, hid_t mem_type, const TensorGeom& g,
                    const std::vector<const EncodedBlock*>& blocks, int k) {
    std::vector<const BlockInfo*> infos;
    std::map<int, const EncodedBlock*> by_id;
    for (const EncodedBlock* e : blocks) {
      infos.push_back(e->info);
      by_id[e->info->id] = e;
    }
    const std::vector<detail::Box> boxes = detail::boxes_of(g, infos);
    H5Id fspace(H5_CHECK(H5Dget_space(dset)));
    for (std::uint32_t c = 0; c < calls_[static_cast<std::size_t>(g.info->id)]; ++c) {
      if (c >= boxes.size()) {
        H5_CHECK(H5Sselect_none(fspace));
        write_selection(dset, mem_type, fspace, nullptr, 0);
        continue;
      }
      std::vector<std::uint32_t> buf(boxes[c].numel);
      auto out = buf.begin();
      detail::for_each_file_row(boxes[c].blocks, [&](const BlockInfo& b, std::int64_t r) {
        const std::vector<std::uint32_t>& src = by_id[b.id]->state[k];
        out = std::copy_n(src.begin() + r * b.cols, b.cols, out);
      });
      detail::select_box(fspace, boxes[c]);
      write_selection(dset, mem_type, fspace, buf.data(), buf.size());
    }
  }

  void write_selection(hid_t dset, hid_t mem_type, hid_t fspace, const void* buf,
                       std::size_t n) {
    H5Id mspace(detail::memory_space_for(fspace, n));
    H5_CHECK(H5Dwrite(dset, mem_type, mspace, fspace, dxpl_, buf));
  }

  const Job& job_;
  const std::vector<TensorGeom>& geom_;
  std::vector<std::uint32_t> calls_;
  int level_, rank_;
  TensorBlocks by_tensor_;
  H5Id file_, dxpl_;
};

// Root attributes; `complete` comes last, after everything else is written.
void write_attributes(hid_t file, const Job& j, const ParamCatalog& catalog,
                      std::uint32_t params_crc, const std::string& anchor_file,
                      std::uint32_t anchor_crc) {
  using detail::write_attr_i64;
  using detail::write_attr_str;
  const ModelShape& s = catalog.shape();
  write_attr_str(file, "format", detail::kFormat);
  write_attr_i64(file, "format_version", j.file_codec == Codec::bitdelta
                                             ? detail::kBitDeltaFormatVersion
                                             : detail::kFormatVersion);
  write_attr_i64(file, "step", j.step);
  write_attr_i64(file, "version", j.version);
  write_attr_i64(file, "tokens_seen", j.tokens);
  write_attr_str(file, "codec", codec_name(j.file_codec));
  if (j.file_codec == Codec::bitdelta) {
    write_attr_i64(file, "bitdelta_bits", j.bits.params);
    write_attr_i64(file, "moment_bits", j.bits.moments);
    write_attr_i64(file, "quant_group", static_cast<std::int64_t>(kQuantGroup));
  }
  if (!j.anchor) {
    write_attr_str(file, "anchor", anchor_file);
    write_attr_i64(file, "anchor_crc32c", anchor_crc);
  }
  write_attr_i64(file, "params_crc32c", params_crc);
  write_attr_str(file, "deck", j.deck);
  write_attr_str(file, "layout", j.layout);
  write_attr_i64(file, "n_layer", s.n_layer);
  write_attr_i64(file, "n_head", s.n_head);
  write_attr_i64(file, "d_model", s.d_model);
  write_attr_i64(file, "vocab_size", s.vocab_size);
  write_attr_i64(file, "padded_vocab", s.padded_vocab);
  write_attr_i64(file, "max_seq_len", s.max_seq_len);
  write_attr_i64(file, "n_blocks", static_cast<std::int64_t>(catalog.blocks().size()));
}

// ---------------------------------------------------------------- the commit's steps

// Per-block arrays each holder fills for its own blocks; the file gets them whole.
void merge_block_tables(MPI_Comm comm, const Job& j, std::size_t n_blocks, Agreed& a) {
  for (int k = 0; k < 3; ++k) {
    a.crc[k].assign(n_blocks, 0);
    a.max_error[k].assign(n_blocks, 0);
  }
  for (const EncodedBlock& e : j.blocks) {
    for (int k = 0; k < 3; ++k) {
      a.crc[k][e.info->id] = e.crc[k];
      std::memcpy(&a.max_error[k][e.info->id], &e.max_error[k], 4);
    }
    a.raw_bytes += 3 * e.info->bytes();
  }
  for (int k = 0; k < 3; ++k) {
    detail::allreduce_bor(comm, a.crc[k]);
    if (state_quant(j.file_codec, j.bits, k)) detail::allreduce_bor(comm, a.max_error[k]);
  }
  a.raw_bytes = detail::allreduce_sum(comm, a.raw_bytes);
}

// The canonical params CRC, combined on holder 0 from every holder's pieces.
std::uint32_t agree_on_params_crc(MPI_Comm comm, const Job& j, const ParamCatalog& catalog) {
  const std::optional<std::uint32_t> crc =
      detail::combine_crc_pieces_on_root(comm, j.pieces, catalog.total_numel());
  std::uint32_t params_crc = crc.value_or(0), covered = crc ? 1 : 0;
  detail::bcast_u32(comm, params_crc);
  detail::bcast_u32(comm, covered);
  if (!covered)
    throw Error(ExitCode::runtime, "checkpoint " + j.path +
                                       ": the holders' blocks do not cover every parameter "
                                       "exactly once");
  return params_crc;
}

// How many boxes the busiest holder has per tensor: the number of collective writes.
std::vector<std::uint32_t> count_collective_writes(MPI_Comm comm, const Job& j,
                                                   const std::vector<TensorGeom>& geom) {
  std::vector<std::uint32_t> calls(2 * geom.size(), 0);
  std::map<int, std::vector<const BlockInfo*>> mine;
  for (const EncodedBlock& e : j.blocks) mine[static_cast<int>(e.info->tensor)].push_back(e.info);
  for (const auto& [t, infos] : mine) {
    calls[static_cast<std::size_t>(t)] =
        static_cast<std::uint32_t>(detail::boxes_of(geom[static_cast<std::size_t>(t)], infos).size());
    calls[geom.size() + static_cast<std::size_t>(t)] = static_cast<std::uint32_t>(
        detail::row_boxes_of(geom[static_cast<std::size_t>(t)], infos, 1).size());
  }
  detail::allreduce_max(comm, calls);
  return calls;
}

Agreed agree_before_writing(MPI_Comm comm, Job& j, const ParamCatalog& catalog) {
  Agreed a;
  a.geom = detail::tensor_geometry(catalog);
  merge_block_tables(comm, j, catalog.blocks().size(), a);
  a.params_crc = agree_on_params_crc(comm, j, catalog);
  // HDF5 metadata writes are collective: every holder must write identical attributes.
  broadcast_string(comm, j.deck);
  broadcast_string(comm, j.layout);
  a.calls = count_collective_writes(comm, j, a.geom);
  return a;
}

// A failed write (a full disk, ...) is an I/O error, status 4: the half-written file goes, the
// previous checkpoints stay as they are. With several holders another one may be inside a
// collective HDF5 call that will never complete: the job ends at once.
[[noreturn]] void abandon_write(const std::string& tmp, const Error& e, int holders) {
  detail::PrecompressedChunks::activate(nullptr);
  std::remove(tmp.c_str());
  if (holders > 1) fatal_abort(ExitCode::data, e.what());
  throw Error(ExitCode::data, e.what());
}

// The datasets and attributes, in the order the test hooks name; `complete` last.
void write_contents(FileWriter& w, const Job& j, const ParamCatalog& catalog, const Agreed& a) {
  test_hooks::checkpoint_write_point("file_created");
  write_attributes(w.file(), j, catalog, a.params_crc, j.base ? j.base->file : "",
                   j.base ? j.base->params_crc : 0);
  // A bitdelta state is quantized or (moments at 0 bits) xor, like an xor file's.
  auto write = [&](int k) {
    if (state_quant(j.file_codec, j.bits, k))
      w.write_quantized(k);
    else
      w.write_state(k);
  };
  write(0);
  test_hooks::checkpoint_write_point("params_written");
  write(1);
  write(2);
  test_hooks::checkpoint_write_point("moments_written");
  if (j.file_codec == Codec::bitdelta) {
    H5Id errors(H5_CHECK(
        H5Gcreate2(w.file(), detail::kMaxError, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)));
    for (int k = 0; k < 3; ++k)
      if (state_quant(j.file_codec, j.bits, k))
        w.write_small(errors, detail::kStateGroups[k], H5T_IEEE_F32LE, H5T_NATIVE_FLOAT,
                      a.max_error[k].data(), catalog.blocks().size());
  }
  H5Id crcs(H5_CHECK(H5Gcreate2(w.file(), detail::kCrc, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)));
  for (int k = 0; k < 3; ++k)
    w.write_small(crcs, detail::kStateGroups[k], H5T_STD_U32LE, H5T_NATIVE_UINT32,
                  a.crc[k].data(), catalog.blocks().size());
  crcs.reset();
  test_hooks::checkpoint_write_point("before_complete");
  detail::write_attr_i64(w.file(), "complete", 1);
  w.close();
}

}  // namespace

// ---------------------------------------------------------------- CheckpointWriter

CheckpointWriter::CheckpointWriter(MPI_Comm holders_comm, const ParamCatalog& catalog,
                                   Codec codec, int anchor_every, std::string dir, int keep,
                                   int zstd_level, BitDeltaBits bits)
    : catalog_(catalog), codec_(codec), anchor_every_(std::max(1, anchor_every)),
      keep_(std::max(0, keep)), level_(zstd_level), dir_(std::move(dir)), bits_(bits) {
  if (bits.params < 1 || bits.params > 8 || bits.moments < 0 || bits.moments == 1 ||
      bits.moments > 8)
    throw Error(ExitCode::deck, "checkpoint: bitdelta bits must be 1..8 for the parameters and "
                                "0 or 2..8 for the moments (got " + std::to_string(bits.params) +
                                    " and " + std::to_string(bits.moments) + ")");
  ensure_hdf5_ready();
  MPI_CHECK(MPI_Comm_dup(holders_comm, &comm_));
  MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  MPI_CHECK(MPI_Comm_size(comm_, &size_));
  std::unique_ptr<Error> err;
  if (rank_ == 0) {
    try {
      create_output_directory(dir_);
    } catch (const Error& e) {
      err = std::make_unique<Error>(e);
    }
  }
  rethrow_collectively(comm_, err.get(), ErrorScope::group);
}

CheckpointWriter::~CheckpointWriter() {
  try {
    if (job_) wait();
  } catch (const Error& e) {
    fatal_abort(e.code(), e.what());  // a destructor cannot report it otherwise
  }
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

bool CheckpointWriter::pending() const { return job_ != nullptr; }

std::string CheckpointWriter::write(std::int64_t step, std::int64_t version,
                                    std::int64_t tokens_seen, const std::string& deck_text,
                                    const std::string& layout_text, const BlockRefs& blocks) {
  const std::string path = start(false, step, version, tokens_seen, deck_text, layout_text, blocks);
  commit();
  return path;
}

std::string CheckpointWriter::write_async(std::int64_t step, std::int64_t version,
                                          std::int64_t tokens_seen, const std::string& deck_text,
                                          const std::string& layout_text,
                                          const BlockRefs& blocks) {
  return start(true, step, version, tokens_seen, deck_text, layout_text, blocks);
}

bool CheckpointWriter::poll() {
  if (!job_) return true;
  // Every holder must decide alike, or some would enter the collective write alone.
  if (!detail::allreduce_and(comm_, job_->done.load(std::memory_order_acquire))) return false;
  commit();
  return true;
}

void CheckpointWriter::wait() {
  if (job_) commit();
}

std::string CheckpointWriter::start(bool async, std::int64_t step, std::int64_t version,
                                    std::int64_t tokens, const std::string& deck,
                                    const std::string& layout, const BlockRefs& blocks) {
  if (job_) commit();  // one checkpoint in flight at a time: deltas need the committed anchor
  auto job = std::make_unique<Job>();
  job->step = step;
  job->version = version;
  job->tokens = tokens;
  job->deck = deck;
  job->layout = layout;
  job->path = dir_ + "/" + checkpoint_file_name(step);
  job->tmp = job->path + ".tmp";
  // raw and zstd checkpoints are all full; delta codecs write an anchor every anchor_every-th
  // time, and first of all (this writer has no anchor in memory yet).
  job->anchor = !is_delta(codec_) || !anchor_ || written_ % anchor_every_ == 0;
  job->file_codec = job->anchor ? (codec_ == Codec::raw ? Codec::raw : Codec::zstd) : codec_;
  job->base = job->anchor ? nullptr : anchor_;
  job->bits = bits_;
  for (const auto& [id, s] : blocks) job->snapshot[id] = *s;  // the only work before returning

  Job* j = job.get();
  const bool keep_anchor = job->anchor && is_delta(codec_);
  job_ = std::move(job);
  auto run = [this, j, async, keep_anchor] {
    encode(*j, catalog_, detail::tensor_geometry(catalog_), level_, async, keep_anchor);
    j->done.store(true, std::memory_order_release);
  };
  if (async)
    j->worker = std::thread(run);
  else
    run();
  return j->path;
}

void CheckpointWriter::commit() {
  std::unique_ptr<Job> job = std::move(job_);  // gone whatever happens below
  Job& j = *job;
  if (j.worker.joinable()) j.worker.join();
  rethrow_collectively(comm_, j.error.get(), ErrorScope::group);
  const double t0 = now_seconds();
  const Agreed agreed = agree_before_writing(comm_, j, catalog_);
  write_file(j, agreed);
  publish(j);
  if (j.anchor && is_delta(codec_)) {
    j.new_anchor->file = detail::base_of(j.path);
    j.new_anchor->params_crc = agreed.params_crc;
    anchor_ = j.new_anchor;
  }
  ++written_;
  stats_.path = j.path;
  stats_.codec = j.file_codec;
  stats_.anchor = j.anchor;
  stats_.raw_bytes = agreed.raw_bytes;
  stats_.encode_seconds = j.encode_seconds;
  stats_.commit_seconds = now_seconds() - t0;
}

// The collective HDF5 write into j.tmp; starts this commit's stats.
void CheckpointWriter::write_file(const Job& j, const Agreed& agreed) {
  detail::PrecompressedChunks::reset_counters();
  detail::PrecompressedChunks::activate(&j.chunks);
  try {
    FileWriter w(j, agreed.geom, agreed.calls, level_, comm_, rank_, size_);
    try {
      write_contents(w, j, catalog_, agreed);
    } catch (const Error& e) {
      // Several holders: end the job before w's destructor closes the file, a collective call
      // that would wait forever for the holders inside another collective HDF5 call.
      if (size_ > 1) abandon_write(j.tmp, e, size_);
      throw;
    }
  } catch (const Error& e) {
    abandon_write(j.tmp, e, size_);
  }
  detail::PrecompressedChunks::activate(nullptr);
  stats_ = WriteStats{};
  stats_.precompressed_chunks = detail::PrecompressedChunks::hits();
  stats_.commit_compressed_chunks = detail::PrecompressedChunks::misses();
}

// The written file becomes the checkpoint: renamed into place, named in `latest`, and older
// checkpoints past `keep` deleted. Holder 0 alone touches names in the directory.
void CheckpointWriter::publish(const Job& j) {
  std::unique_ptr<Error> err;
  if (rank_ == 0) {
    try {
      test_hooks::checkpoint_write_point("before_rename");
      detail::publish(j.tmp, j.path);  // removes j.tmp if it fails
      test_hooks::checkpoint_write_point("before_latest");
      detail::write_latest(dir_, detail::base_of(j.path));
      stats_.deleted = detail::apply_retention(dir_, j.step, keep_);
      stats_.file_bytes = static_cast<std::int64_t>(std::filesystem::file_size(j.path));
    } catch (const Error& e) {
      err = std::make_unique<Error>(e);
    } catch (const std::exception& e) {
      err = std::make_unique<Error>(ExitCode::data, "checkpoint " + j.path + ": " + e.what());
    }
  }
  rethrow_collectively(comm_, err.get(), ErrorScope::group);
  stats_.file_bytes = detail::allreduce_sum(comm_, rank_ == 0 ? stats_.file_bytes : 0);
}

}  // namespace pdtrain::ckpt
