// A whole decode step of a Llama-family model in one call: every layer of a batch of
// sequences that each add one token, from token ids to next-token logits.
//
// Run op by op from Python, a batch-1 step of a small model spends more time between the
// matmuls than in them: hundreds of tensor ops each cost their dispatch, and each parallel
// region wakes the thread pool again. Here the step is one parallel region whose threads
// claim the work in chunks (decode_job.h): every projection's output rows (ggml_matmul.h,
// reading the GGUF's blocks as stored), and the attention by sequence, KV head and a fixed
// span of context. Attention reads each sequence's K and V where they lie in the paged cache,
// with no gather, and the new token's K and V go into its slot with the span that holds it.
//
// How a row's numbers are computed depends only on that row and the model, never on which
// thread runs what or on the other rows of the batch: a sequence's logits are the same alone
// or batched, with any number of threads.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <chrono>
#include <mutex>
#include <vector>

#include "decode_job.h"
#include "thread_governor.h"

namespace crescent {

// The cache's element type for a torch dtype; false for one the cache never stores.
inline bool kv_type_of(at::ScalarType dtype, KvType& out) {
  switch (dtype) {
    case at::kFloat: out = KvType::kF32; return true;
    case at::kBFloat16: out = KvType::kBF16; return true;
    case at::kHalf: out = KvType::kF16; return true;
    case at::kFloat8_e4m3fn: out = KvType::kFP8E4M3; return true;
    default: return false;
  }
}

// The fused step's own conversions into and out of a cache of `dtype`, alone, so that tests
// hold them against torch's bit for bit: `values` fp32 (a multiple of 16 of them) as the
// cache stores them, and stored values widened back to fp32.
at::Tensor kv_store_values(const at::Tensor& values, at::ScalarType dtype) {
  KvType type = KvType::kF32;
  TORCH_CHECK(kv_type_of(dtype, type), "kv_store: not a KV cache dtype: ", dtype);
  TORCH_CHECK(values.scalar_type() == at::kFloat && values.is_contiguous() &&
                  values.numel() % 16 == 0,
              "kv_store: values must be contiguous float32, a multiple of 16 of them");
  at::Tensor out = at::empty(values.sizes(), values.options().dtype(dtype));
  kv_store(type, values.data_ptr<float>(), out.data_ptr(), values.numel());
  return out;
}

at::Tensor kv_load_values(const at::Tensor& stored) {
  KvType type = KvType::kF32;
  TORCH_CHECK(kv_type_of(stored.scalar_type(), type), "kv_load: not a KV cache dtype: ",
              stored.scalar_type());
  TORCH_CHECK(stored.is_contiguous() && stored.numel() % 16 == 0,
              "kv_load: stored must be contiguous, a multiple of 16 values");
  at::Tensor out = at::empty(stored.sizes(), stored.options().dtype(at::kFloat));
  kv_load(type, stored.data_ptr(), out.data_ptr<float>(), stored.numel());
  return out;
}

// Owns a model's weights for the fused step (the tensors are shared with the Python model,
// not copied) and runs its steps, one at a time.
class DecodeModel : public torch::CustomClassHolder {
 public:
  // `embed`: the token embeddings' rows as blocks of `embed_qtype` (ggml_rows.h; float32
  // viewed as bytes is type 0). `blocks`/`qtypes`: every projection's parts in order (per layer
  // QKV, output, gate/up, down, then the head), `parts` of them for each. `qkv_order`: empty,
  // or where each QKV output column goes (llama.cpp's Q/K row order undone).
  DecodeModel(at::Tensor embed, int64_t embed_qtype, std::vector<at::Tensor> norms,
              std::vector<at::Tensor> blocks, std::vector<int64_t> qtypes,
              std::vector<int64_t> parts, at::Tensor qkv_order, at::Tensor cos, at::Tensor sin,
              std::vector<int64_t> dims, double eps) {
    TORCH_CHECK(dims.size() == 6, "DecodeModel: dims are layers, hidden, intermediate, heads, "
                "kv_heads, head_dim");
    LlamaWeights& m = m_;
    m.layers = dims[0], m.hidden = dims[1], m.inter = dims[2], m.heads = dims[3];
    m.kv_heads = dims[4], m.head_dim = dims[5], m.eps = static_cast<float>(eps);
    m.embed = embed, m.embed_qtype = embed_qtype, m.cos = cos.contiguous(), m.sin = sin.contiguous();
    m.vocab = m.embed.size(0);
    TORCH_CHECK(m.heads % m.kv_heads == 0, "DecodeModel: heads must be a multiple of kv_heads");
    m.attend_span = attend_span_for(m.head_dim, m.group());
    TORCH_CHECK(m.attend_span != nullptr, "DecodeModel: head_dim must be 64 or 128, with at most ",
                kMaxGroup, " query heads per KV head");
    TORCH_CHECK(m.hidden % 32 == 0 && m.inter % 32 == 0, "DecodeModel: widths must be multiples of 32");
    check_blocks(m.embed, embed_qtype, m.vocab, m.hidden, "the embedding");
    TORCH_CHECK(m.cos.scalar_type() == at::kFloat && m.cos.dim() == 2 &&
                    m.cos.size(1) == m.head_dim && m.sin.sizes() == m.cos.sizes(),
                "DecodeModel: rotary tables must be float32 [positions, head_dim]");
    TORCH_CHECK(static_cast<int64_t>(norms.size()) == 2 * m.layers + 1, "DecodeModel: norms");
    for (auto& n : norms) {
      TORCH_CHECK(n.scalar_type() == at::kFloat && n.numel() == m.hidden, "DecodeModel: norm size");
      m.norms.push_back(n.contiguous());
    }
    TORCH_CHECK(qkv_order.numel() == 0 || (qkv_order.scalar_type() == at::kInt &&
                                           qkv_order.is_contiguous() &&
                                           qkv_order.numel() == m.qkv_width()),
                "DecodeModel: qkv_order must be empty or int32 [qkv width]");
    if (qkv_order.numel() > 0) {
      std::vector<bool> seen(m.qkv_width(), false);
      const int32_t* order = qkv_order.data_ptr<int32_t>();
      for (int64_t j = 0; j < m.qkv_width(); ++j) {
        TORCH_CHECK(order[j] >= 0 && order[j] < m.qkv_width() && !seen[order[j]],
                    "DecodeModel: qkv_order must be a permutation");
        seen[order[j]] = true;
      }
    }
    m.qkv_order = qkv_order;
    TORCH_CHECK(static_cast<int64_t>(parts.size()) == 4 * m.layers + 1 &&
                    qtypes.size() == blocks.size(), "DecodeModel: projections");
    size_t next = 0;
    auto add = [&](int64_t index, int64_t rows, int64_t cols) {
      Weight w{{}, 0, cols};
      for (int64_t p = 0; p < parts[index]; ++p, ++next) {
        TORCH_CHECK(next < blocks.size(), "DecodeModel: fewer blocks than parts");
        const at::Tensor& b = blocks[next];
        check_blocks(b, qtypes[next], b.size(0), cols, "a projection's part");
        w.parts.push_back({b, b.data_ptr<uint8_t>(), qtypes[next], b.size(0), b.stride(0)});
        w.rows += b.size(0);
      }
      TORCH_CHECK(w.rows == rows, "DecodeModel: a projection's parts hold ", w.rows,
                  " rows, expected ", rows);
      m.weights.push_back(std::move(w));
    };
    for (int64_t l = 0; l < m.layers; ++l) {
      add(4 * l, m.qkv_width(), m.hidden);
      add(4 * l + 1, m.hidden, m.attn_width());
      add(4 * l + 2, 2 * m.inter, m.hidden);
      add(4 * l + 3, m.hidden, m.inter);
    }
    add(4 * m.layers, m.vocab, m.hidden);
    TORCH_CHECK(next == blocks.size(), "DecodeModel: more blocks than parts");
  }

  // Logits [rows, vocab] of the next token of each row. `kv` is the paged cache
  // [blocks, layers, 2, block_size, kv_heads, head_dim] (float32, bfloat16 or float16), into which the new tokens'
  // K and V are written; block_tables [rows, max_blocks] and context_lens [rows] are int32.
  at::Tensor step(at::Tensor token_ids, at::Tensor block_tables, at::Tensor context_lens,
                  at::Tensor kv) {
    const Batch batch = check(token_ids, block_tables, context_lens, kv);
    at::Tensor logits = at::empty({batch.rows, m_.vocab}, m_.cos.options());
    if (batch.rows == 0) return logits;
    at::init_num_threads();
    std::lock_guard<std::mutex> lock(mutex_);
    const int threads = governor_.threads_for_next_step(std::max(1, at::get_num_threads()));
    const auto start = std::chrono::steady_clock::now();
    DecodeJob job(m_, batch, logits.data_ptr<float>(), threads);
    if (threads == 1) {
      job.work();
    } else {
      // torch's own OpenMP team: threads of a second pool would find its workers still
      // spinning after the step's other parallel ops, and the two would fight for the cores.
#pragma omp parallel num_threads(threads)
      job.work();
    }
    redone_chunks_ += job.redone_chunks();
    const auto wall = std::chrono::steady_clock::now() - start;
    governor_.record(threads, std::chrono::duration_cast<std::chrono::nanoseconds>(wall).count(),
                     job.waited_ns());
    return logits;
  }

  // Steps run, steps run on one thread because the cores were taken, shared steps found
  // contended, of all threads' time in shared steps the total and the time spent waiting
  // (ThreadGovernor), and chunks computed again because their thread took too long.
  std::vector<int64_t> stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    const ThreadGovernor& g = governor_;
    return {g.steps(),     g.steps_alone(),      g.contended_steps(),
            g.shared_ns(), g.shared_waited_ns(), redone_chunks_};
  }

 private:
  static void check_blocks(const at::Tensor& blocks, int64_t qtype, int64_t rows, int64_t cols,
                           const char* what) {
    int64_t weights = 0, bytes = 0;
    formats::block_shape(qtype, weights, bytes);
    TORCH_CHECK(weights > 0, "DecodeModel: unsupported ggml type ", qtype, " for ", what);
    TORCH_CHECK(cols % weights == 0 && cols % formats::kChunk == 0 && blocks.device().is_cpu() &&
                    blocks.scalar_type() == at::kByte && blocks.dim() == 2 &&
                    blocks.stride(1) == 1 && blocks.size(0) == rows &&
                    blocks.size(1) == cols / weights * bytes,
                "DecodeModel: the blocks of ", what, " do not hold [", rows, ", ", cols, "]");
  }

  Batch check(const at::Tensor& ids, const at::Tensor& tables, const at::Tensor& lens,
              const at::Tensor& kv) const {
    TORCH_CHECK(ids.scalar_type() == at::kLong && ids.dim() == 1 && ids.is_contiguous(),
                "decode step: token_ids must be a contiguous int64 [rows]");
    const int64_t rows = ids.size(0);
    TORCH_CHECK(tables.scalar_type() == at::kInt && tables.dim() == 2 && tables.is_contiguous() &&
                    tables.size(0) == rows, "decode step: block_tables must be int32 [rows, n]");
    TORCH_CHECK(lens.scalar_type() == at::kInt && lens.dim() == 1 && lens.is_contiguous() &&
                    lens.size(0) == rows, "decode step: context_lens must be int32 [rows]");
    KvType type = KvType::kF32;
    TORCH_CHECK(kv.device().is_cpu() && kv_type_of(kv.scalar_type(), type) && kv.is_contiguous() &&
                    kv.dim() == 6 && kv.size(1) == m_.layers && kv.size(2) == 2 &&
                    kv.size(3) > 0 && kv.size(4) == m_.kv_heads && kv.size(5) == m_.head_dim,
                "decode step: kv must be the model's contiguous float32, bfloat16, float16 or "
                "float8_e4m3fn paged cache");
    const int64_t* id = ids.data_ptr<int64_t>();
    const int32_t* len = lens.data_ptr<int32_t>();
    const int32_t* table = tables.data_ptr<int32_t>();
    const int64_t block_size = kv.size(3);
    int64_t max_spans = 0;
    for (int64_t r = 0; r < rows; ++r) {
      TORCH_CHECK(id[r] >= 0 && id[r] < m_.vocab, "decode step: token id ", id[r], " out of range");
      TORCH_CHECK(len[r] >= 1 && len[r] <= m_.cos.size(0), "decode step: context length ", len[r],
                  " out of range");
      const int64_t blocks = (len[r] + block_size - 1) / block_size;
      TORCH_CHECK(blocks <= tables.size(1), "decode step: block table too short");
      for (int64_t b = 0; b < blocks; ++b) {
        const int32_t block = table[r * tables.size(1) + b];
        TORCH_CHECK(block >= 0 && block < kv.size(0), "decode step: block id ", block,
                    " out of range");
      }
      max_spans = std::max<int64_t>(max_spans, (len[r] + kSpanTokens - 1) / kSpanTokens);
    }
    return {rows, tables.size(1), block_size, id, table, len, kv.data_ptr(), type, max_spans};
  }

  LlamaWeights m_;
  ThreadGovernor governor_;
  int64_t redone_chunks_ = 0;
  std::mutex mutex_;
};

}  // namespace crescent

TORCH_LIBRARY(crescent, m) {
  m.class_<crescent::DecodeModel>("DecodeModel")
      .def(torch::init<at::Tensor, int64_t, std::vector<at::Tensor>, std::vector<at::Tensor>,
                       std::vector<int64_t>, std::vector<int64_t>, at::Tensor, at::Tensor,
                       at::Tensor, std::vector<int64_t>, double>())
      .def("step", &crescent::DecodeModel::step)
      .def("stats", &crescent::DecodeModel::stats);
  m.def("kv_store(Tensor values, ScalarType dtype) -> Tensor", &crescent::kv_store_values);
  m.def("kv_load(Tensor stored) -> Tensor", &crescent::kv_load_values);
}
