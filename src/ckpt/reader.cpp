// Reading checkpoints: metadata, blocks for any holder assignment, anchors of deltas, and the
// verification of every block's CRC32C. Each holder opens the file itself, read-only, through
// the POSIX driver: reading needs no coordination, so only the verdict is collective.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "comm.hpp"
#include "files.hpp"
#include "format.hpp"
#include "geometry.hpp"
#include "h5_util.hpp"
#include "pdtrain/ckpt/canonical_crc.hpp"
#include "pdtrain/ckpt/checkpoint.hpp"
#include "pdtrain/core/agreement.hpp"
#include "pdtrain/core/crc32c.hpp"
#include "pdtrain/core/mpi_check.hpp"
#include "reader_impl.hpp"

namespace pdtrain::ckpt {

using detail::TensorGeom;

namespace detail {

std::string hex32(std::uint32_t x) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", x);
  return buf;
}

namespace {

std::string dims_text(int rank, const hsize_t* d) {
  std::string s = "[";
  for (int i = 0; i < rank; ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

Error data_error(const std::string& path, const std::string& what) {
  return Error(ExitCode::data, "checkpoint " + path + ": " + what);
}

// "params/qkvw block 17 h.0.qkvw[rows 0..16, cols 0..16]"
std::string block_text(const ParamCatalog& catalog, const std::string& dataset, int id) {
  return dataset + " block " + std::to_string(id) + " " + catalog.block_name(catalog.block(id));
}

// Opens dataset `name` of `group` and checks its shape and element type.
H5Id open_dataset(hid_t file, const std::string& path, const std::string& name, int rank,
                  const hsize_t* dims, H5T_class_t cls, std::size_t elem_size) {
  if (!exists(file, name)) throw data_error(path, "dataset " + name + " is missing");
  H5Id d(H5_CHECK(H5Dopen2(file, name.c_str(), H5P_DEFAULT)));
  H5Id space(H5_CHECK(H5Dget_space(d)));
  hsize_t got[H5S_MAX_RANK];
  const int r = H5_CHECK(H5Sget_simple_extent_dims(space, got, nullptr));
  bool same = r == rank;
  for (int i = 0; same && i < rank; ++i) same = got[i] == dims[i];
  if (!same)
    throw data_error(path, "dataset " + name + " has shape " + dims_text(r, got) +
                               " but the model needs " + dims_text(rank, dims));
  H5Id type(H5_CHECK(H5Dget_type(d)));
  if (H5_CHECK(H5Tget_class(type)) != cls || H5Tget_size(type) != elem_size)
    throw data_error(path, "dataset " + name + " has an unexpected element type");
  return d;
}

// Reads the selection `fspace` of `dset` into `buf` (n elements of mem_type). The one HDF5
// call whose failure is not thrown at once: the caller retries block by block to name the
// damaged block.
herr_t read_selection(hid_t dset, hid_t mem_type, hid_t fspace, void* buf, std::size_t n) {
  H5Id mspace(memory_space_for(fspace, n));
  const herr_t rc = H5Dread(dset, mem_type, mspace, fspace, H5P_DEFAULT, buf);
  if (rc < 0) H5Eclear2(H5E_DEFAULT);
  return rc;
}

}  // namespace

CheckpointMeta read_meta_of(hid_t file, const std::string& path) {
  H5Context ctx(path, "");
  CheckpointMeta m;
  m.path = path;
  const auto format = read_attr_str(file, "format");
  if (!format || *format != kFormat)
    throw data_error(path, "not a pdtrain checkpoint (no format = \"pdtrain-checkpoint\")");
  m.format_version = read_attr_i64(file, "format_version").value_or(0);
  const auto codec = read_attr_str(file, "codec");
  const bool bitdelta = codec && *codec == codec_name(Codec::bitdelta);
  // bitdelta files have their own version: version 1's (1 bit per weight, params_signs) is
  // no longer read; its anchor, a zstd file, still is.
  const std::int64_t supported = bitdelta ? kBitDeltaFormatVersion : kFormatVersion;
  if (m.format_version != supported)
    throw data_error(path, "format_version " + std::to_string(m.format_version) +
                               (bitdelta ? " of a bitdelta file" : "") +
                               " is not supported (this pdtrain reads version " +
                               std::to_string(supported) + ")" +
                               (bitdelta && m.format_version == 1
                                    ? "; restart from its anchor " +
                                          read_attr_str(file, "anchor").value_or("?") + " instead"
                                    : ""));
  auto need_i64 = [&](const char* name) {
    const auto v = read_attr_i64(file, name);
    if (!v) throw data_error(path, std::string("attribute ") + name + " is missing");
    return *v;
  };
  m.step = need_i64("step");
  m.version = need_i64("version");
  m.tokens_seen = need_i64("tokens_seen");
  if (!codec || !codec_from_string(*codec))
    throw data_error(path, "attribute codec is missing or unknown");
  m.codec = *codec_from_string(*codec);
  if (is_delta(m.codec)) {
    m.anchor = read_attr_str(file, "anchor").value_or("");
    if (m.anchor.empty()) throw data_error(path, "delta checkpoint without an anchor attribute");
    m.anchor_crc32c = static_cast<std::uint32_t>(need_i64("anchor_crc32c"));
  }
  if (bitdelta) {
    m.bits.params = static_cast<int>(need_i64("bitdelta_bits"));
    m.bits.moments = static_cast<int>(need_i64("moment_bits"));
    const std::int64_t group = need_i64("quant_group");
    if (m.bits.params < 1 || m.bits.params > 8 || m.bits.moments < 0 || m.bits.moments == 1 ||
        m.bits.moments > 8 || group != static_cast<std::int64_t>(kQuantGroup))
      throw data_error(path, "bitdelta_bits " + std::to_string(m.bits.params) + ", moment_bits " +
                                 std::to_string(m.bits.moments) + ", quant_group " +
                                 std::to_string(group) + " are not a layout this pdtrain reads");
  }
  m.params_crc32c = static_cast<std::uint32_t>(need_i64("params_crc32c"));
  m.deck = read_attr_str(file, "deck").value_or("");
  m.layout = read_attr_str(file, "layout").value_or("");
  m.shape.n_layer = need_i64("n_layer");
  m.shape.n_head = need_i64("n_head");
  m.shape.d_model = need_i64("d_model");
  m.shape.vocab_size = need_i64("vocab_size");
  m.shape.padded_vocab = need_i64("padded_vocab");
  m.shape.max_seq_len = need_i64("max_seq_len");
  m.shape.seq_len = m.shape.max_seq_len;  // not part of the parameters
  m.n_blocks = need_i64("n_blocks");
  m.complete = read_attr_i64(file, "complete").value_or(0) == 1;
  return m;
}

std::string shape_text(const ModelShape& s) {
  return "n_layer=" + std::to_string(s.n_layer) + ", n_head=" + std::to_string(s.n_head) +
         ", d_model=" + std::to_string(s.d_model) + ", vocab_size=" + std::to_string(s.vocab_size) +
         " (padded " + std::to_string(s.padded_vocab) + "), max_seq_len=" +
         std::to_string(s.max_seq_len);
}

void check_usable(const CheckpointMeta& m, const ParamCatalog& catalog) {
  if (!m.complete)
    throw data_error(m.path, "incomplete (no complete = 1: its write did not finish)");
  const ModelShape& s = catalog.shape();
  const ModelShape& f = m.shape;
  if (f.n_layer != s.n_layer || f.n_head != s.n_head || f.d_model != s.d_model ||
      f.vocab_size != s.vocab_size || f.padded_vocab != s.padded_vocab ||
      f.max_seq_len != s.max_seq_len || m.n_blocks != static_cast<std::int64_t>(catalog.blocks().size()))
    throw data_error(m.path, "written for a model with " + shape_text(f) +
                                 ", but this model has " + shape_text(s));
}

BlockReader::BlockReader(std::string path, const ParamCatalog& catalog, Problems* problems)
    : path_(std::move(path)), catalog_(catalog), geom_(tensor_geometry(catalog)),
      problems_(problems) {
  file_ = open_read_only(path_);
  meta_ = read_meta_of(file_, path_);
}

void BlockReader::report(const Error& e, int id) {
  if (!problems_) throw e;
  problems_->push_back(e.what());
  if (id >= 0) bad_.insert(id);
}

std::vector<std::uint32_t> BlockReader::read_small(const std::string& name, std::size_t n,
                                                   H5T_class_t cls) {
  H5Context ctx(path_, name);
  const hsize_t dims = n;
  H5Id d = open_dataset(file_, path_, name, 1, &dims, cls, 4);
  std::vector<std::uint32_t> out(n);
  H5Id space(H5_CHECK(H5Dget_space(d)));
  if (read_selection(d, cls == H5T_FLOAT ? H5T_NATIVE_FLOAT : H5T_NATIVE_UINT32, space,
                     out.data(), n) < 0)
    throw data_error(path_, "cannot read dataset " + name + " (damaged)");
  return out;
}

std::map<int, std::vector<std::uint32_t>> BlockReader::read_state(int k, bool xored,
                                                                  const std::vector<int>& ids) {
  std::map<int, std::vector<std::uint32_t>> out;
  std::map<int, std::vector<const BlockInfo*>> by_tensor;
  for (int id : ids) by_tensor[static_cast<int>(catalog_.block(id).tensor)].push_back(&catalog_.block(id));
  for (const auto& [t, blocks] : by_tensor) {
    const TensorGeom& g = geom_[t];
    const std::string name = std::string(kStateGroups[k]) + "/" + g.name();
    H5Context ctx(path_, name);
    H5Id d = open_dataset(file_, path_, name, g.rank, g.dims, xored ? H5T_INTEGER : H5T_FLOAT, 4);
    const hid_t mem_type = xored ? H5T_NATIVE_UINT32 : H5T_NATIVE_FLOAT;
    H5Id fspace(H5_CHECK(H5Dget_space(d)));
    for (const Box& box : boxes_of(g, blocks)) {
      std::vector<std::uint32_t> buf(box.numel);
      select_box(fspace, box);
      if (read_selection(d, mem_type, fspace, buf.data(), buf.size()) < 0) {
        // Some chunk does not decode: find which blocks, one at a time, to name them.
        for (const BlockInfo* b : box.blocks) {
          std::vector<std::uint32_t> one(static_cast<std::size_t>(b->numel()));
          select_blocks(fspace, g, {b});
          if (read_selection(d, mem_type, fspace, one.data(), one.size()) < 0)
            report(data_error(path_, block_text(catalog_, name, b->id) +
                                         ": cannot be read (damaged chunk)"),
                   b->id);
          else
            out[b->id] = std::move(one);
        }
        continue;
      }
      for (const BlockInfo* b : box.blocks) out[b->id].resize(static_cast<std::size_t>(b->numel()));
      auto in = buf.begin();
      for_each_file_row(box.blocks, [&](const BlockInfo& b, std::int64_t r) {
        std::copy_n(in, b.cols, out[b.id].begin() + r * b.cols);
        in += b.cols;
      });
    }
  }
  return out;
}

template <class T>
std::map<int, std::vector<T>> BlockReader::read_rows(const std::string& group, std::size_t bits,
                                                     const std::vector<int>& ids) {
  std::map<int, std::vector<T>> out;
  std::map<int, std::vector<const BlockInfo*>> by_tensor;
  for (int id : ids) by_tensor[static_cast<int>(catalog_.block(id).tensor)].push_back(&catalog_.block(id));
  const hid_t mem_type = sizeof(T) == 1 ? H5T_NATIVE_UINT8 : H5T_NATIVE_UINT32;
  for (const auto& [t, blocks] : by_tensor) {
    const TensorGeom& g = geom_[t];
    // codes: bits > 0; scale pairs: bits = 0
    const std::size_t width = bits ? g.code_row(static_cast<int>(bits)) : g.scale_row();
    const std::string name = group + "/" + g.name();
    H5Context ctx(path_, name);
    const hsize_t dims[2] = {static_cast<hsize_t>(g.n_blocks), width};
    H5Id d = open_dataset(file_, path_, name, 2, dims, H5T_INTEGER, sizeof(T));
    H5Id fspace(H5_CHECK(H5Dget_space(d)));
    for (const Box& box : row_boxes_of(g, blocks, width)) {
      std::vector<T> buf(box.numel);
      select_box(fspace, box);
      const bool ok = read_selection(d, mem_type, fspace, buf.data(), buf.size()) >= 0;
      for (std::size_t i = 0; i < box.blocks.size(); ++i) {
        const int id = box.blocks[i]->id;
        if (ok) {
          out[id].assign(buf.begin() + static_cast<std::ptrdiff_t>(i * width),
                         buf.begin() + static_cast<std::ptrdiff_t>((i + 1) * width));
          continue;
        }
        Box one;  // find the damaged rows one at a time, to name them
        one.start[0] = static_cast<hsize_t>(id - g.first_block);
        one.count[0] = 1;
        one.count[1] = width;
        select_box(fspace, one);
        std::vector<T> row(width);
        if (read_selection(d, mem_type, fspace, row.data(), row.size()) < 0)
          report(data_error(path_, block_text(catalog_, name, id) + ": cannot be read (damaged chunk)"),
                 id);
        else
          out[id] = std::move(row);
      }
    }
  }
  return out;
}

std::map<int, BlockState> BlockReader::read(const std::vector<int>& ids) {
  for (int id : ids)
    if (id < 0 || id >= static_cast<int>(catalog_.blocks().size()))
      throw Error(ExitCode::runtime, "read_checkpoint: no block " + std::to_string(id));
  check_usable(meta_, catalog_);
  const Codec codec = meta_.codec;
  // Deltas decode against their anchor, which must be the very checkpoint they were made from.
  std::map<int, BlockState> base;
  if (is_delta(codec)) {
    const std::string anchor_path = dir_of(path_) + "/" + meta_.anchor;
    if (!std::filesystem::exists(anchor_path))
      throw data_error(path_, "its anchor " + anchor_path + " is missing");
    BlockReader anchor(anchor_path, catalog_, problems_);
    if (!anchor.meta().is_anchor())
      throw data_error(path_, "its anchor " + anchor_path + " is itself a delta");
    if (anchor.meta().params_crc32c != meta_.anchor_crc32c)
      throw data_error(path_, "its anchor " + anchor_path + " has params_crc32c " +
                                  hex32(anchor.meta().params_crc32c) + ", expected " +
                                  hex32(meta_.anchor_crc32c) + " (a different checkpoint)");
    base = anchor.read(ids);
    for (int id : ids)
      if (!base.count(id)) bad_.insert(id);  // reported by the anchor's reader
  }

  const std::size_t nb = catalog_.blocks().size();
  std::vector<std::uint32_t> crc[3];
  for (int k = 0; k < 3; ++k)
    crc[k] = read_small(std::string(kCrc) + "/" + kStateGroups[k], nb, H5T_INTEGER);

  // Each state is quantized (bitdelta) or stored as fp32 / xor bits.
  std::map<int, std::vector<std::uint32_t>> bits[3], scales[3];
  std::map<int, std::vector<std::uint8_t>> codes[3];
  std::optional<StateQuant> quant[3];
  for (int k = 0; k < 3; ++k) {
    quant[k] = state_quant(codec, meta_.bits, k);
    const std::string state = kStateGroups[k];
    if (quant[k]) {
      codes[k] = read_rows<std::uint8_t>(state + kCodesSuffix,
                                         static_cast<std::size_t>(quant[k]->bits), ids);
      scales[k] = read_rows<std::uint32_t>(state + kScalesSuffix, 0, ids);
    } else {
      bits[k] = read_state(k, is_delta(codec), ids);
    }
  }

  std::map<int, BlockState> out;
  for (int id : ids) {
    if (bad_.count(id)) continue;
    const BlockInfo& b = catalog_.block(id);
    const TensorGeom& g = geom_[static_cast<int>(b.tensor)];
    const std::size_t n = static_cast<std::size_t>(b.numel());
    BlockState s;
    s.decay = catalog_.tensor(b.tensor).weight_decay;
    std::vector<float>* dst[3] = {&s.param, &s.m, &s.v};
    const BlockState* a = is_delta(codec) ? &base.at(id) : nullptr;
    const std::vector<float>* ref[3] = {a ? &a->param : nullptr, a ? &a->m : nullptr,
                                        a ? &a->v : nullptr};
    for (int k = 0; k < 3; ++k) {
      dst[k]->resize(n);
      if (quant[k]) {
        dequantize(quant[k]->q, quant[k]->bits, codes[k].at(id).data(), scales[k].at(id).data(),
                   ref[k] ? ref[k]->data() : nullptr, n, dst[k]->data());
      } else {
        std::vector<std::uint32_t>& w = bits[k].at(id);
        if (a) {
          std::vector<std::uint32_t> rb(n);
          std::memcpy(rb.data(), ref[k]->data(), n * 4);
          xor_bits(w.data(), rb.data(), w.data(), n);
        }
        std::memcpy(dst[k]->data(), w.data(), n * 4);
      }
      const std::uint32_t got = crc32c(dst[k]->data(), n * 4);
      if (got != crc[k][id]) {
        const std::string ds = std::string(kStateGroups[k]) + (quant[k] ? kCodesSuffix : "") +
                               "/" + g.name();
        report(data_error(path_, "CRC32C mismatch in " + block_text(catalog_, ds, id) +
                                     " (stored " + hex32(crc[k][id]) + ", data " + hex32(got) + ")"),
               id);
      }
    }
    if (!bad_.count(id)) out[id] = std::move(s);
  }
  return out;
}

}  // namespace detail

CheckpointMeta read_meta(const std::string& path) {
  H5Id file = detail::open_read_only(path);
  return detail::read_meta_of(file, path);
}

Checkpoint read_checkpoint(const std::string& path, const ParamCatalog& catalog,
                           MPI_Comm holders_comm, const std::vector<int>& block_ids) {
  ensure_hdf5_ready();
  Checkpoint ck;
  std::vector<CrcPiece> pieces;
  std::unique_ptr<Error> err;
  try {
    detail::BlockReader r(path, catalog, nullptr);
    ck.blocks = r.read(block_ids);
    ck.meta = r.meta();
    for (const auto& [id, s] : ck.blocks)
      append_crc_pieces(catalog, catalog.block(id), s.param.data(), pieces);
  } catch (const Error& e) {
    err = std::make_unique<Error>(e);
  }
  rethrow_collectively(holders_comm, err.get(), ErrorScope::group);

  // When the holders together hold the whole model, its canonical CRC must be the file's.
  const std::int64_t total =
      detail::allreduce_sum(holders_comm, static_cast<std::int64_t>(block_ids.size()));
  if (total == static_cast<std::int64_t>(catalog.blocks().size())) {
    const std::optional<std::uint32_t> crc =
        detail::combine_crc_pieces_on_root(holders_comm, pieces, catalog.total_numel());
    err.reset();
    if (crc && *crc != ck.meta.params_crc32c)  // holder 0 only
      err = std::make_unique<Error>(
          ExitCode::data, "checkpoint " + path + ": the parameters' canonical CRC32C " +
                              detail::hex32(*crc) + " differs from params_crc32c " +
                              detail::hex32(ck.meta.params_crc32c));
    rethrow_collectively(holders_comm, err.get(), ErrorScope::group);
  }
  return ck;
}

namespace {

// "" if the checkpoint at `path` can be used (with `verify_data`, every block decodes with its
// CRC32C correct), else "<path> does not verify: <why>" (the why may name its anchor).
std::string check_file(const std::string& path, bool verify_data) {
  try {
    const CheckpointMeta m = read_meta(path);
    const ParamCatalog catalog(m.shape);
    detail::check_usable(m, catalog);
    if (verify_data) {
      std::vector<int> all(catalog.blocks().size());
      for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
      const std::map<int, BlockState> blocks =
          detail::BlockReader(path, catalog, nullptr).read(all);
      // A diverged state is no restart point (pdtrain never writes one; an older one might).
      for (const auto& [id, b] : blocks)
        for (const std::vector<float>* v : {&b.param, &b.m, &b.v})
          if (std::any_of(v->begin(), v->end(), [](float x) { return !std::isfinite(x); }))
            return path + " does not verify: block " + catalog.block_name(catalog.block(id)) +
                   " holds a value that is not finite (a diverged state)";
    }
    return "";
  } catch (const Error& err) {
    return path + " does not verify: " + err.what();
  }
}

}  // namespace

LatestValid find_latest_valid(const std::string& dir, bool verify_data,
                              std::int64_t before_step) {
  ensure_hdf5_ready();
  LatestValid out;
  std::vector<detail::DirEntry> candidates = detail::list_checkpoints(dir);
  std::erase_if(candidates, [&](const detail::DirEntry& e) { return e.step >= before_step; });
  // `latest` names the checkpoint the last writer published; prefer it (newer-numbered files
  // can be left over from an abandoned run that was restarted from an earlier step).
  if (const auto latest = detail::read_latest(dir)) {
    auto it = std::find_if(candidates.begin(), candidates.end(),
                           [&](const detail::DirEntry& e) { return e.name == *latest; });
    if (it != candidates.end()) std::rotate(candidates.begin(), it, it + 1);
  }
  for (const detail::DirEntry& e : candidates) {
    const std::string path = dir + "/" + e.name;
    const std::string damage = check_file(path, verify_data);
    if (damage.empty()) {
      out.path = path;
      return out;
    }
    out.warnings.push_back(damage);
  }
  return out;
}

std::string checkpoint_damage(const std::string& path) {
  ensure_hdf5_ready();
  return check_file(path, true);
}

}  // namespace pdtrain::ckpt
