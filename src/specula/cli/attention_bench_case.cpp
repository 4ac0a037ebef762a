// AttentionBenchSetup: builds the workload once; run_layer() is what gets timed.
#include "specula/cli/attention_bench_case.h"

#include <algorithm>
#include <numeric>

#include "specula/kv/token_allocator.h"

namespace specula {

namespace {
// Random normal values; on a GPU a random block of up to 4 Mi elements is tiled over the tensor
// (a gigabyte cache would take minutes to fill element by element on one host core, and the
// values do not change the memory traffic being measured).
void fill_random(const TensorView& t, std::mt19937_64& rng, float scale) {
  std::normal_distribution<float> dist(0.0f, scale);
  const int64_t block = t.device().is_cpu() ? t.numel() : std::min<int64_t>(t.numel(), int64_t{4} << 20);
  std::vector<float> tmp(static_cast<size_t>(block));
  for (float& x : tmp) x = dist(rng);
  if (t.device().is_cpu()) {
    convert_from_float(tmp.data(), t.data(), t.dtype(), tmp.size());
    return;
  }
  Buffer host(t.dtype(), {block});
  convert_from_float(tmp.data(), host.data(), t.dtype(), tmp.size());
  const size_t elem = dtype_size(t.dtype());
  for (int64_t done = 0; done < t.numel(); done += block) {
    const int64_t count = std::min(block, t.numel() - done);
    copy(TensorView(static_cast<char*>(t.data()) + done * static_cast<int64_t>(elem), t.dtype(), {count}, t.device()),
         host.view().slice(0, count));
  }
}
}  // namespace

AttentionBenchSetup::AttentionBenchSetup(const AttentionBenchCase& c, AttentionBackend& backend, Device device,
                                         uint64_t seed)
    : case_(c), backend_(backend) {
  SPECULA_CHECK(c.mode == ForwardMode::DECODE || c.mode == ForwardMode::EXTEND,
                "bench case '{}': mode must be DECODE or EXTEND", c.name);
  if (c.mode == ForwardMode::DECODE) case_.extend_len = 1;
  std::mt19937_64 rng(seed);
  const int bs = c.batch_size;
  const int seq_len = case_.prefix_len + case_.extend_len;
  const int pages_per_req = (seq_len + c.page_size - 1) / c.page_size;

  layer_.num_q_heads = c.num_q_heads;
  layer_.num_kv_heads = c.num_kv_heads;
  layer_.head_dim = c.head_dim;
  layer_.attn_type = c.causal ? AttentionType::DECODER : AttentionType::ENCODER_ONLY;
  layer_.dca_chunk_len = c.dca_chunk_len;
  layer_.dca_original_max_position = c.dca_original_max;
  layer_.dca_sparse = c.dca_sparse;
  backend_.check_layer(layer_, c.q_dtype, c.kv_dtype);

  PagedTokenAllocator allocator(static_cast<int64_t>(bs) * pages_per_req * c.page_size, c.page_size);
  SPECULA_CHECK(c.layers >= 1, "bench case '{}': layers {} must be at least 1", c.name, c.layers);
  kv_pool_ = std::make_unique<MHAKVPool>(KVPoolConfig{allocator.total_slots(), c.layers, c.num_kv_heads, c.head_dim,
                                                      c.head_dim, c.kv_dtype, device});
  req_pool_ = std::make_unique<ReqToTokenPool>(bs, seq_len);
  // Pages in shuffled order, so reads are as scattered as in a long-running server.
  auto slots = allocator.alloc(allocator.num_pages() * c.page_size);
  SPECULA_ASSERT(slots.has_value());
  std::vector<int32_t> pages(static_cast<size_t>(allocator.num_pages()));
  for (size_t i = 0; i < pages.size(); ++i) pages[i] = (*slots)[i * static_cast<size_t>(c.page_size)] / c.page_size;
  std::shuffle(pages.begin(), pages.end(), rng);

  batch_.forward_mode = c.mode;
  batch_.batch_size = bs;
  batch_.req_to_token_pool = req_pool_.get();
  batch_.token_to_kv_pool = kv_pool_.get();
  for (int r = 0; r < bs; ++r) {
    std::vector<int32_t> tokens(static_cast<size_t>(seq_len));
    for (int t = 0; t < seq_len; ++t) {
      tokens[static_cast<size_t>(t)] = pages[static_cast<size_t>(r * pages_per_req + t / c.page_size)] * c.page_size + t % c.page_size;
    }
    req_pool_->write(r, 0, tokens);
    batch_.req_pool_indices.push_back(r);
    batch_.seq_lens.push_back(seq_len);
    if (c.mode == ForwardMode::EXTEND) {
      batch_.extend_prefix_lens.push_back(case_.prefix_len);
      batch_.extend_seq_lens.push_back(case_.extend_len);
    }
    for (int t = case_.prefix_len; t < seq_len; ++t) {
      batch_.out_cache_loc.push_back(tokens[static_cast<size_t>(t)]);
      batch_.positions.push_back(t);
    }
  }
  for (int l = 0; l < c.layers; ++l) {
    fill_random(kv_pool_->k_buffer(l), rng, 1.0f);
    fill_random(kv_pool_->v_buffer(l), rng, 1.0f);
  }

  const int64_t n = batch_.num_tokens();
  q_ = Buffer(c.q_dtype, {n, c.num_q_heads, layer_.dca_q_variants() * c.head_dim}, device);
  k_ = Buffer(c.q_dtype, {n, c.num_kv_heads, c.head_dim}, device);
  v_ = Buffer(c.q_dtype, {n, c.num_kv_heads, c.head_dim}, device);
  out_ = Buffer(c.q_dtype, {n, c.num_q_heads, c.head_dim}, device);
  fill_random(q_, rng, 1.0f);
  fill_random(k_, rng, 1.0f);
  fill_random(v_, rng, 1.0f);
}

std::vector<int32_t> AttentionBenchSetup::cached_slots() const {
  std::vector<int32_t> slots;
  const int seq_len = case_.prefix_len + case_.extend_len;
  for (int r = 0; r < case_.batch_size; ++r) {
    const int32_t* row = req_pool_->row(r);
    slots.insert(slots.end(), row, row + seq_len);
  }
  return slots;
}

void AttentionBenchSetup::init_metadata() { backend_.init_forward_metadata(batch_); }

void AttentionBenchSetup::run_layer(int layer) {
  layer_.layer_id = layer;
  ForwardOptions options;
  options.save_kv_cache = false;
  backend_.forward(q_, k_, v_, out_, layer_, batch_, options);
}

namespace {
// Visible (query, key) pairs of one request.
double visible_pairs(const AttentionBenchCase& c) {
  const double p = c.prefix_len, e = c.extend_len;
  return c.causal ? e * p + e * (e + 1) / 2 : e * (p + e);
}
}  // namespace

double AttentionBenchSetup::kv_bytes_read() const {
  const double rows = static_cast<double>(case_.batch_size) * (case_.prefix_len + case_.extend_len);
  return rows * case_.num_kv_heads * 2.0 * case_.head_dim * static_cast<double>(dtype_size(case_.kv_dtype));
}

double AttentionBenchSetup::attention_flops() const {
  return case_.batch_size * visible_pairs(case_) * case_.num_q_heads * 4.0 * case_.head_dim;
}

}  // namespace specula
