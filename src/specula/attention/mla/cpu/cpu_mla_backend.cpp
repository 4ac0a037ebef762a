// CpuMlaBackend: metadata, argument checks, the cache write, and per-token attention over lists
// of visible keys. Each query token's keys are decoded rows of its request (dense) or of the
// slots its sparse indices name; partial results over key ranges (prefix chunks, then the new
// tokens) are combined with merge_state, and sinks are folded in once at the end.
#include "specula/attention/mla/cpu/cpu_mla_backend.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>

#include "specula/attention/merge_state.h"
#include "specula/attention/mla/cpu/indexer.h"
#include "specula/attention/mla/sparse_indices.h"
#include "specula/core/error.h"
#include "specula/core/thread_pool.h"
#include "specula/kv/req_to_token_pool.h"

namespace specula {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// One query token (q: num_heads x qk_dim, f32) against nk keys, row(i) giving key i's decoded
// row (qk_dim values; the value is its first v_dim). o: num_heads x v_dim, lse: num_heads.
// Scores are kept per head so the softmax is exact two-pass (max, then sum); nk == 0 gives o = 0
// and lse = -inf, the empty state merge_state expects.
template <typename RowFn>
void attend_token(const float* q, int num_heads, int qk_dim, int v_dim, float scale, int64_t nk, RowFn row,
                  std::vector<float>& scores, float* o, float* lse) {
  std::fill(o, o + static_cast<int64_t>(num_heads) * v_dim, 0.0f);
  if (nk == 0) {
    std::fill(lse, lse + num_heads, kNegInf);
    return;
  }
  scores.resize(static_cast<size_t>(num_heads * nk));
  for (int64_t i = 0; i < nk; ++i) {
    const float* k = row(i);
    for (int h = 0; h < num_heads; ++h) {
      const float* qh = q + static_cast<int64_t>(h) * qk_dim;
      float dot = 0.0f;
      for (int d = 0; d < qk_dim; ++d) dot += qh[d] * k[d];
      scores[static_cast<size_t>(h * nk + i)] = dot * scale;
    }
  }
  std::vector<float> sum(static_cast<size_t>(num_heads));
  for (int h = 0; h < num_heads; ++h) {
    float* s = scores.data() + h * nk;
    const float m = *std::max_element(s, s + nk);
    float total = 0.0f;
    for (int64_t i = 0; i < nk; ++i) {
      s[i] = std::exp(s[i] - m);
      total += s[i];
    }
    sum[static_cast<size_t>(h)] = total;
    lse[h] = m + std::log(total);
  }
  for (int64_t i = 0; i < nk; ++i) {
    const float* v = row(i);
    for (int h = 0; h < num_heads; ++h) {
      const float p = scores[static_cast<size_t>(h * nk + i)];
      float* oh = o + static_cast<int64_t>(h) * v_dim;
      for (int d = 0; d < v_dim; ++d) oh[d] += p * v[d];
    }
  }
  for (int h = 0; h < num_heads; ++h) {
    const float inv = 1.0f / sum[static_cast<size_t>(h)];
    float* oh = o + static_cast<int64_t>(h) * v_dim;
    for (int d = 0; d < v_dim; ++d) oh[d] *= inv;
  }
}

// Sinks join the denominator only: lse' = log(e^lse + e^sink), o' = o e^(lse - lse').
void apply_sinks(const std::vector<float>& sinks, int v_dim, float* o, float* lse) {
  for (size_t h = 0; h < sinks.size(); ++h) {
    const float m = std::max(lse[h], sinks[h]);
    const float merged = m + std::log(std::exp(lse[h] - m) + std::exp(sinks[h] - m));
    const float w = std::exp(lse[h] - merged);
    for (int d = 0; d < v_dim; ++d) o[h * static_cast<size_t>(v_dim) + static_cast<size_t>(d)] *= w;
    lse[h] = merged;
  }
}

}  // namespace

CpuMlaBackend::CpuMlaBackend(const MlaBackendOptions& options)
    : options_(options), threads_(options.thread_pool != nullptr ? options.thread_pool : &default_thread_pool()) {
  SPECULA_CHECK(options.device.is_cpu(), "the cpu MLA backend cannot run on {}", options.device.str());
  SPECULA_CHECK(options.page_size >= 1, "page_size {} is not valid; it must be >= 1", options.page_size);
  SPECULA_CHECK(options.prefix_chunk_tokens >= 0, "prefix_chunk_tokens {} must be >= 0 (0: no chunking)",
                options.prefix_chunk_tokens);
  SPECULA_CHECK(options.extend_form != MlaExtendForm::expanded,
                "the cpu MLA backend runs extend in the absorbed form only; extend form 'expanded' needs cuda");
}

void CpuMlaBackend::check_layer(const MlaLayer& layer, DType q_dtype, MlaKVFormat kv_format) const {
  const std::string problem = common_mla_layer_problem(layer);
  SPECULA_CHECK(problem.empty(), "cpu MLA backend cannot serve layer {}: {}", layer.layer_id, problem);
  SPECULA_CHECK(q_dtype == DType::f32 || q_dtype == DType::bf16 || q_dtype == DType::f16,
                "cpu MLA backend: query dtype {} is not supported; supported: f32, bf16, f16", dtype_name(q_dtype));
  SPECULA_CHECK(kv_format != MlaKVFormat::fp8_ds_mla || layer.kv_lora_rank % kMlaFp8TileSize == 0,
                "layer {}: kv_lora_rank {} must be a multiple of {} for the fp8_ds_mla cache", layer.layer_id,
                layer.kv_lora_rank, kMlaFp8TileSize);
}

void CpuMlaBackend::init_forward_metadata(const ForwardBatch& batch) {
  batch.validate();
  Metadata md;
  md.batch = &batch;
  md.mode = batch.forward_mode;
  md.num_tokens = batch.num_tokens();
  if (batch.forward_mode == ForwardMode::IDLE || batch.batch_size == 0) {
    metadata_ = std::move(md);
    return;
  }
  SPECULA_CHECK(batch.req_to_token_pool != nullptr && batch.mla_kv_pool != nullptr,
                "the batch has no req_to_token_pool or MLA KV pool");
  const int bs = batch.batch_size;
  const bool verify_mask = batch.forward_mode == ForwardMode::TARGET_VERIFY && !batch.spec_info->custom_mask.empty();
  int64_t mask_offset = 0;
  int32_t token = 0;
  int max_prefix = 0;
  for (int i = 0; i < bs; ++i) {
    const int32_t kv_len = batch.kv_len(i);
    const int32_t q_len = batch.query_len(i);
    md.kv_lens.push_back(kv_len);
    md.first_token.push_back(token);
    md.mask_offset.push_back(mask_offset);
    if (verify_mask) mask_offset += static_cast<int64_t>(q_len) * kv_len;
    for (int32_t j = 0; j < q_len; ++j) {
      md.req_id_per_token.push_back(i);
      md.token_pos.push_back(kv_len - q_len + j);
    }
    token += q_len;
    if (is_extend_like(batch.forward_mode) && batch.forward_mode != ForwardMode::TARGET_VERIFY) {
      max_prefix = std::max(max_prefix, batch.extend_prefix_lens[static_cast<size_t>(i)]);
    }
  }
  SPECULA_CHECK(token == md.num_tokens, "the batch's query lengths add up to {} tokens but it has {}", token,
                md.num_tokens);
  if (verify_mask) {
    SPECULA_CHECK(static_cast<int64_t>(batch.spec_info->custom_mask.size()) == mask_offset,
                  "TARGET_VERIFY custom_mask has {} entries; the batch needs {}", batch.spec_info->custom_mask.size(),
                  mask_offset);
  }
  md.page_table = build_page_table(*batch.req_to_token_pool, batch.req_pool_indices, md.kv_lens, options_.page_size);
  const int64_t num_slots = batch.mla_kv_pool->num_slots();
  for (int i = 0; i < bs; ++i) {
    const int32_t num_pages = (md.kv_lens[static_cast<size_t>(i)] + options_.page_size - 1) / options_.page_size;
    for (int32_t pg = 0; pg < num_pages; ++pg) {
      const int64_t page = md.page_table.row(i)[pg];
      SPECULA_CHECK(page >= 0 && (page + 1) * options_.page_size <= num_slots,
                    "request {}: page {} of its KV (page id {}) is outside the MLA KV pool of {} slots", i, pg, page,
                    num_slots);
    }
  }
  const int C = options_.prefix_chunk_tokens;
  md.num_prefix_chunks = C > 0 ? (max_prefix + C - 1) / C : 0;
  metadata_ = std::move(md);
}

void CpuMlaBackend::forward(const TensorView& q, const TensorView& kv_c, const TensorView& k_pe, const TensorView& out,
                            const MlaLayer& layer, const ForwardBatch& batch, const MlaForwardOptions& options) {
  SPECULA_CHECK(metadata_.batch == &batch && metadata_.mode == batch.forward_mode &&
                    metadata_.num_tokens == batch.num_tokens(),
                "init_forward_metadata was not called for this batch before forward");
  if (batch.forward_mode == ForwardMode::IDLE || batch.batch_size == 0) return;
  MLAKVPool& pool = *batch.mla_kv_pool;
  check_layer(layer, q.dtype(), pool.format());
  SPECULA_CHECK(pool.kv_lora_rank() == layer.kv_lora_rank && pool.qk_rope_head_dim() == layer.qk_rope_head_dim,
                "layer {} has kv_lora_rank {} / rope {}, but the MLA pool holds {} / {}", layer.layer_id,
                layer.kv_lora_rank, layer.qk_rope_head_dim, pool.kv_lora_rank(), pool.qk_rope_head_dim());
  const int64_t n = batch.num_tokens();
  const int H = layer.num_q_heads;
  const int D = layer.qk_head_dim();
  const int R = layer.kv_lora_rank;
  check_shape(q, {n, H, D}, "MLA q");
  check_shape(out, {n, H, R}, "MLA output");
  SPECULA_CHECK(q.is_contiguous() && out.is_contiguous(), "MLA q {} and output {} must be contiguous", q.str(), out.str());
  SPECULA_CHECK(out.dtype() == q.dtype(), "MLA output dtype {} must equal q's {}", dtype_name(out.dtype()),
                dtype_name(q.dtype()));
  if (options.lse.defined()) {
    check_shape(options.lse, {n, H}, "MLA lse");
    check_dtype(options.lse, DType::f32, "MLA lse");
    SPECULA_CHECK(options.lse.is_contiguous(), "MLA lse {} must be contiguous", options.lse.str());
  }
  const bool sparse = options.topk_indices.defined();
  int topk = 0;
  std::vector<int32_t> sparse_slots;
  if (sparse) {
    SPECULA_CHECK(options.topk_indices.rank() == 2 && options.topk_indices.size(0) == n,
                  "topk_indices {} must be [{} tokens, topk]", options.topk_indices.str(), n);
    check_dtype(options.topk_indices, DType::i32, "topk_indices");
    SPECULA_CHECK(options.topk_indices.is_contiguous(), "topk_indices {} must be contiguous", options.topk_indices.str());
    topk = static_cast<int>(options.topk_indices.size(1));
    sparse_slots.resize(static_cast<size_t>(n * topk));
    SparseIndexTables tables{metadata_.req_id_per_token, metadata_.page_table.pages, metadata_.kv_lens,
                             metadata_.page_table.max_pages, options_.page_size};
    convert_req_index_to_global_index(
        tables, std::span<const int32_t>(options.topk_indices.data_as<const int32_t>(), static_cast<size_t>(n * topk)),
        topk, sparse_slots);
  }
  if (options.save_kv_cache) pool.set_mla_kv_buffer(layer.layer_id, batch.out_cache_loc, kv_c, k_pe);
  if (n == 0) return;

  const int bs = batch.batch_size;
  const ForwardMode mode = batch.forward_mode;
  // Dense attention decodes each request's rows once; every query of the request reads them.
  std::vector<std::vector<float>> rows(static_cast<size_t>(bs));
  if (!sparse) {
    threads_->parallel_for(bs, [&](int64_t r, int) {
      const int32_t kv_len = metadata_.kv_lens[static_cast<size_t>(r)];
      rows[static_cast<size_t>(r)].resize(static_cast<size_t>(kv_len) * static_cast<size_t>(D));
      const int32_t* slots = batch.req_to_token_pool->row(batch.req_pool_indices[static_cast<size_t>(r)]);
      pool.read_rows(layer.layer_id, std::span<const int32_t>(slots, static_cast<size_t>(kv_len)),
                     rows[static_cast<size_t>(r)].data());
    });
  }

  std::vector<float> q32(static_cast<size_t>(n * H * D));
  convert_to_float(q.data(), q.dtype(), q32.data(), q32.size());
  std::vector<float> acc(static_cast<size_t>(n * H * R));
  std::vector<float> acc_lse(static_cast<size_t>(n * H));
  const float scale = layer.scaling;

  // Runs attend_token for every query token over the key positions keys(t, list) puts in list
  // (dense: positions of the request's decoded rows), into o / s.
  auto run_dense = [&](auto&& keys, float* o, float* s) {
    const int nt = threads_->num_threads();
    std::vector<std::vector<float>> scores(static_cast<size_t>(nt));
    std::vector<std::vector<int32_t>> lists(static_cast<size_t>(nt));
    threads_->parallel_for(n, [&](int64_t t, int thread) {
      std::vector<int32_t>& list = lists[static_cast<size_t>(thread)];
      list.clear();
      keys(t, list);
      const float* req_rows = rows[static_cast<size_t>(metadata_.req_id_per_token[static_cast<size_t>(t)])].data();
      attend_token(q32.data() + t * H * D, H, D, R, scale, static_cast<int64_t>(list.size()),
                   [&](int64_t i) { return req_rows + static_cast<int64_t>(list[static_cast<size_t>(i)]) * D; },
                   scores[static_cast<size_t>(thread)], o + t * H * R, s + t * H);
    });
  };
  auto range = [](std::vector<int32_t>& list, int32_t begin, int32_t end) {
    for (int32_t j = begin; j < end; ++j) list.push_back(j);
  };

  if (sparse) {
    const int nt = threads_->num_threads();
    std::vector<std::vector<float>> scores(static_cast<size_t>(nt));
    std::vector<std::vector<float>> key_rows(static_cast<size_t>(nt));
    const TensorView cache = pool.kv_buffer(layer.layer_id);
    const int64_t row_bytes = pool.row_bytes();
    threads_->parallel_for(n, [&](int64_t t, int thread) {
      std::vector<float>& kr = key_rows[static_cast<size_t>(thread)];
      kr.clear();
      for (int i = 0; i < topk; ++i) {
        const int32_t slot = sparse_slots[static_cast<size_t>(t * topk + i)];
        if (slot < 0) continue;
        kr.resize(kr.size() + static_cast<size_t>(D));
        decode_mla_row(pool.format(), cache.data_as<const uint8_t>() + static_cast<int64_t>(slot) * row_bytes, R,
                       layer.qk_rope_head_dim, kr.data() + kr.size() - static_cast<size_t>(D));
      }
      attend_token(q32.data() + t * H * D, H, D, R, scale, static_cast<int64_t>(kr.size() / static_cast<size_t>(D)),
                   [&](int64_t i) { return kr.data() + i * D; }, scores[static_cast<size_t>(thread)],
                   acc.data() + t * H * R, acc_lse.data() + t * H);
    });
  } else if (mode == ForwardMode::DECODE) {
    run_dense([&](int64_t t, std::vector<int32_t>& list) {
      range(list, 0, metadata_.kv_lens[static_cast<size_t>(metadata_.req_id_per_token[static_cast<size_t>(t)])]);
    }, acc.data(), acc_lse.data());
  } else if (mode == ForwardMode::TARGET_VERIFY) {
    const std::vector<uint8_t>& mask = batch.spec_info->custom_mask;
    run_dense([&](int64_t t, std::vector<int32_t>& list) {
      const auto r = static_cast<size_t>(metadata_.req_id_per_token[static_cast<size_t>(t)]);
      const int32_t pos = metadata_.token_pos[static_cast<size_t>(t)];
      if (mask.empty()) return range(list, 0, pos + 1);
      const int32_t kv_len = metadata_.kv_lens[r];
      const uint8_t* m = mask.data() + metadata_.mask_offset[r] + (t - metadata_.first_token[r]) * int64_t{kv_len};
      for (int32_t j = 0; j < kv_len; ++j) {
        if (m[j] != 0) list.push_back(j);
      }
    }, acc.data(), acc_lse.data());
  } else {
    const int C = options_.prefix_chunk_tokens;
    auto prefix_of = [&](int64_t t) {
      return batch.extend_prefix_lens[static_cast<size_t>(metadata_.req_id_per_token[static_cast<size_t>(t)])];
    };
    if (C == 0) {
      run_dense([&](int64_t t, std::vector<int32_t>& list) {
        range(list, 0, metadata_.token_pos[static_cast<size_t>(t)] + 1);
      }, acc.data(), acc_lse.data());
    } else {
      // SGLang's chunked prefix: the prefix in chunks of C keys, each merged into the running
      // state, then the new tokens' causal part merged last.
      std::fill(acc.begin(), acc.end(), 0.0f);
      std::fill(acc_lse.begin(), acc_lse.end(), kNegInf);
      std::vector<float> part(acc.size());
      std::vector<float> part_lse(acc_lse.size());
      const TensorView acc_v(acc.data(), DType::f32, {n, H, R});
      const TensorView acc_s(acc_lse.data(), DType::f32, {n, H});
      const TensorView part_v(part.data(), DType::f32, {n, H, R});
      const TensorView part_s(part_lse.data(), DType::f32, {n, H});
      for (int c = 0; c <= metadata_.num_prefix_chunks; ++c) {
        const bool last = c == metadata_.num_prefix_chunks;
        run_dense([&](int64_t t, std::vector<int32_t>& list) {
          const int32_t prefix = prefix_of(t);
          if (last) return range(list, prefix, metadata_.token_pos[static_cast<size_t>(t)] + 1);
          range(list, std::min(prefix, c * C), std::min(prefix, (c + 1) * C));
        }, part.data(), part_lse.data());
        merge_state(acc_v, acc_s, part_v, part_s, acc_v, acc_s);
      }
    }
  }

  if (!layer.sinks.empty()) {
    for (int64_t t = 0; t < n; ++t) apply_sinks(layer.sinks, R, acc.data() + t * H * R, acc_lse.data() + t * H);
  }
  convert_from_float(acc.data(), out.data(), out.dtype(), acc.size());
  if (options.lse.defined()) std::copy(acc_lse.begin(), acc_lse.end(), options.lse.data_as<float>());
}

void CpuMlaBackend::indexer_topk(const TensorView& q, const TensorView& weights, const TensorView& index_k,
                                 const MlaLayer& layer, const ForwardBatch& batch, const TensorView& out,
                                 bool save_index_k) {
  SPECULA_CHECK(metadata_.batch == &batch && metadata_.mode == batch.forward_mode,
                "init_forward_metadata was not called for this batch before indexer_topk");
  if (batch.forward_mode == ForwardMode::IDLE || batch.batch_size == 0) return;
  MLAKVPool& pool = *batch.mla_kv_pool;
  if (save_index_k) pool.set_index_k(layer.layer_id, batch.out_cache_loc, index_k);
  SPECULA_CHECK(out.rank() == 2, "indexer output {} must be [num_tokens, topk]", out.str());
  indexer_topk_cpu(q, weights, pool, layer.layer_id, batch, static_cast<int>(out.size(1)), out, *threads_);
}

}  // namespace specula
