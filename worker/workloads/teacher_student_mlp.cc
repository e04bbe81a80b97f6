// The teacher-student MLP workload of teacher_student_mlp.h: generator-driven data and initial
// weights, and a hand-written forward/backward over single-threaded OpenBLAS sgemm (bf16/fp16
// weights widened a row tile at a time).
#include "worker/workloads/teacher_student_mlp.h"

#include <cblas.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "sharding/model_catalog.h"
#include "worker/workloads/counter_rng.h"
#include "worker/workloads/row_blocks.h"

namespace zeroshard::workloads {
namespace {

// out[b, o] = in[b, i] * weight[o, i]^T + bias[o], every row starting from the bias.
void LinearForward(const float* in, const float* weight, const float* bias, int64_t batch,
                   int64_t in_size, int64_t out_size, float* out) {
  for (int64_t j = 0; j < batch; ++j) std::copy(bias, bias + out_size, out + j * out_size);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(batch),
              static_cast<int>(out_size), static_cast<int>(in_size), 1.0f, in,
              static_cast<int>(in_size), weight, static_cast<int>(in_size), 1.0f, out,
              static_cast<int>(out_size));
}

void ReluInPlace(float* values, int64_t count) {
  for (int64_t k = 0; k < count; ++k) values[k] = values[k] > 0.0f ? values[k] : 0.0f;
}

}  // namespace

absl::StatusOr<StoredParameters> CheckedMlpParameters(
    ParameterSource& params, absl::Span<const sharding::TensorSpec> tensors, int64_t tensor) {
  ZS_ASSIGN_OR_RETURN(const StoredParameters values, params.Parameters(tensor));
  if (values.size != tensors[tensor].num_elements) {
    return absl::InvalidArgumentError(absl::StrCat("params: ", tensors[tensor].name, " has ",
                                                   values.size, " elements, expected ",
                                                   tensors[tensor].num_elements));
  }
  if (!numerics::IsValidDType(values.dtype)) {
    return absl::InvalidArgumentError(absl::StrCat("params: ", tensors[tensor].name,
                                                   " has an invalid dtype (",
                                                   static_cast<int>(values.dtype), ")"));
  }
  return values;
}

int64_t WeightTileRows(int64_t in_size, int64_t out_size) {
  return std::max<int64_t>(1, std::min(out_size, kWeightTileElems / in_size));
}

uint64_t MlpStream(MlpRole role, uint64_t number) {
  return (static_cast<uint64_t>(role) << 32) | number;
}

absl::Status FillLayerParameters(MlpRole role, absl::Span<const int64_t> sizes, uint64_t seed,
                                 int64_t layer, bool bias, absl::Span<float> out) {
  if (role == MlpRole::kInputs) return absl::InvalidArgumentError("role: not a network");
  if (layer < 0 || layer + 1 >= static_cast<int64_t>(sizes.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer: ", layer, " is not a Linear layer of ", sizes.size() - 1));
  }
  const int64_t fan_in = sizes[layer];
  const int64_t fan_out = sizes[layer + 1];
  const int64_t count = bias ? fan_out : fan_out * fan_in;
  if (static_cast<int64_t>(out.size()) != count) {
    return absl::InvalidArgumentError(
        absl::StrCat("out: has ", out.size(), " elements, the tensor ", count));
  }
  const CounterRng rng(seed, MlpStream(role, 2 * layer + (bias ? 1 : 0)));
  rng.FillSymmetricUniform(0, InitBound(fan_in), out);
  return absl::OkStatus();
}

void FillSampleInput(absl::Span<const int64_t> sizes, uint64_t seed, int64_t sample,
                     absl::Span<float> out) {
  const CounterRng rng(seed, MlpStream(MlpRole::kInputs, 0));
  rng.FillSymmetricUniform(static_cast<uint64_t>(sample) * sizes[0], 1.0f, out);
}

absl::Status ValidateTeacherStudentMlpOptions(const TeacherStudentMlpOptions& options) {
  if (options.world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("world_size: must be at least 1, got ", options.world_size));
  }
  if (options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank: must be in [0, ", options.world_size, "), got ", options.rank));
  }
  if (options.global_batch < 1 || options.global_batch > kMaxGlobalBatch) {
    return absl::InvalidArgumentError(absl::StrCat("global_batch: must be in [1, ", kMaxGlobalBatch,
                                                   "], got ", options.global_batch));
  }
  if (options.global_batch % options.world_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("global_batch: ", options.global_batch,
                                                   " is not a multiple of world_size ",
                                                   options.world_size));
  }
  if (options.dataset_size < 1 || options.dataset_size > kMaxDatasetSize) {
    return absl::InvalidArgumentError(absl::StrCat("dataset_size: must be in [1, ", kMaxDatasetSize,
                                                   "], got ", options.dataset_size));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<TeacherStudentMlp>> TeacherStudentMlp::Create(
    const TeacherStudentMlpOptions& options) {
  ZS_ASSIGN_OR_RETURN(std::vector<sharding::TensorSpec> tensors,
                      sharding::TensorsForLayerSizes(options.layer_sizes));
  ZS_RETURN_IF_ERROR(ValidateTeacherStudentMlpOptions(options));
  // Single-threaded BLAS is deterministic and leaves the cores to the engine
  // (docs/design.md, "OpenBLAS").
  openblas_set_num_threads(1);
  return std::unique_ptr<TeacherStudentMlp>(new TeacherStudentMlp(options, std::move(tensors)));
}

TeacherStudentMlp::TeacherStudentMlp(TeacherStudentMlpOptions options,
                                     std::vector<sharding::TensorSpec> tensors)
    : options_(std::move(options)),
      tensors_(std::move(tensors)),
      num_layers_(static_cast<int64_t>(options_.layer_sizes.size()) - 1),
      local_batch_(options_.global_batch / options_.world_size) {
  const std::vector<int64_t>& sizes = options_.layer_sizes;
  const int64_t max_size = *std::max_element(sizes.begin(), sizes.end());
  for (int64_t l = 0; l < num_layers_; ++l) {
    const int64_t in = sizes[l];
    const int64_t out = sizes[l + 1];
    teacher_weights_.emplace_back(in * out);
    teacher_biases_.emplace_back(out);
    // The layer sizes are validated, so these cannot fail.
    FillLayerParameters(MlpRole::kTeacher, sizes, options_.seed, l, false,
                        absl::MakeSpan(teacher_weights_.back()))
        .IgnoreError();
    FillLayerParameters(MlpRole::kTeacher, sizes, options_.seed, l, true,
                        absl::MakeSpan(teacher_biases_.back()))
        .IgnoreError();
  }
  for (int64_t size : sizes) activations_.emplace_back(local_batch_ * size);
  targets_.resize(local_batch_ * sizes.back());
  for (int k = 0; k < 2; ++k) {
    teacher_scratch_[k].resize(local_batch_ * max_size);
    delta_[k].resize(local_batch_ * max_size);
  }
  row_grad_.resize(max_size);
  int64_t tile_elems = 0;
  for (int64_t l = 0; l < num_layers_; ++l) {
    tile_elems = std::max(tile_elems, WeightTileRows(sizes[l], sizes[l + 1]) * sizes[l]);
  }
  weight_tile_.resize(tile_elems);
  widened_bias_.resize(max_size);
  student_weights_.resize(num_layers_);
  student_biases_.resize(num_layers_);
}

int64_t TeacherStudentMlp::BiasTensor(int64_t layer) const { return 2 * (num_layers_ - 1 - layer); }

int64_t MlpSampleIndex(const TeacherStudentMlpOptions& options, int64_t step, int64_t j) {
  const int64_t n = options.dataset_size;
  const int64_t local_batch = options.global_batch / options.world_size;
  // Every factor is reduced first; n <= 2^40 and B <= 2^20 keep the product below 2^60.
  const int64_t start = (step % n) * (options.global_batch % n) % n;
  return (start + (options.rank * local_batch + j) % n) % n;
}

absl::Status FillStudentInitialParameters(const TeacherStudentMlpOptions& options, int64_t tensor,
                                          absl::Span<float> out) {
  const int64_t num_layers = static_cast<int64_t>(options.layer_sizes.size()) - 1;
  if (tensor < 0 || tensor >= 2 * num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor: ", tensor, " is not in [0, ", 2 * num_layers, ")"));
  }
  const int64_t layer = num_layers - 1 - tensor / 2;
  const bool bias = tensor % 2 == 0;
  return FillLayerParameters(MlpRole::kStudent, options.layer_sizes, options.seed, layer, bias,
                             out);
}

int64_t TeacherStudentMlp::SampleIndex(int64_t step, int64_t j) const {
  return MlpSampleIndex(options_, step, j);
}

absl::Status TeacherStudentMlp::InitialParameters(int64_t tensor, absl::Span<float> out) const {
  return FillStudentInitialParameters(options_, tensor, out);
}

void TeacherStudentMlp::LoadMicroBatch(int64_t step) {
  const std::vector<int64_t>& sizes = options_.layer_sizes;
  const int64_t in_size = sizes[0];
  float* inputs = activations_[0].data();
  for (int64_t j = 0; j < local_batch_; ++j) {
    FillSampleInput(sizes, options_.seed, SampleIndex(step, j),
                    absl::MakeSpan(inputs + j * in_size, in_size));
  }
  const float* in = inputs;
  for (int64_t l = 0; l < num_layers_; ++l) {
    const bool last = l + 1 == num_layers_;
    float* out = last ? targets_.data() : teacher_scratch_[l % 2].data();
    LinearForward(in, teacher_weights_[l].data(), teacher_biases_[l].data(), local_batch_, sizes[l],
                  sizes[l + 1], out);
    if (!last) ReluInPlace(out, local_batch_ * sizes[l + 1]);
    in = out;
  }
}

void TeacherStudentMlp::WeightGradientRows(int64_t layer, const float* delta, int64_t first_row,
                                           int64_t rows, float* out) const {
  // out[o - first_row, i] = sum_j delta[j, o] * activation[j, i], o in [first_row, first_row +
  // rows).
  const int64_t in_size = options_.layer_sizes[layer];
  const int64_t out_size = options_.layer_sizes[layer + 1];
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(rows),
              static_cast<int>(in_size), static_cast<int>(local_batch_), 1.0f, delta + first_row,
              static_cast<int>(out_size), activations_[layer].data(), static_cast<int>(in_size),
              0.0f, out, static_cast<int>(in_size));
}

absl::Status TeacherStudentMlp::WeightGradient(int64_t layer, const float* delta,
                                               GradientSink& sink) {
  const int64_t tensor = BiasTensor(layer) + 1;
  const int64_t in_size = options_.layer_sizes[layer];
  const int64_t elements = tensors_[tensor].num_elements;
  return ForEachGradSegment(
      sink, tensor, elements, [&](int64_t begin, int64_t end, absl::Span<float> out) {
        // A row cut by a segment boundary is computed whole into row_grad_ and copied in parts;
        // every other row is computed straight into the segment's buffer.
        return ForEachRowBlock(
            begin, end, in_size,
            [&](int64_t row, int64_t from, int64_t to, int64_t offset) {
              WeightGradientRows(layer, delta, row, 1, row_grad_.data());
              std::copy(row_grad_.data() + (from - row * in_size),
                        row_grad_.data() + (to - row * in_size), out.data() + offset);
              return absl::OkStatus();
            },
            [&](int64_t first_row, int64_t rows, int64_t offset) {
              WeightGradientRows(layer, delta, first_row, rows, out.data() + offset);
              return absl::OkStatus();
            });
      });
}

void TeacherStudentMlp::StudentLinearForward(int64_t layer, const float* in, float* out) {
  const int64_t in_size = options_.layer_sizes[layer];
  const int64_t out_size = options_.layer_sizes[layer + 1];
  const StoredParameters& weight = student_weights_[layer];
  const StoredParameters& bias = student_biases_[layer];
  const float* bias_values = static_cast<const float*>(bias.data);
  if (bias.dtype != numerics::DType::kFloat32) {
    WidenParameters(bias, 0, out_size, widened_bias_.data());
    bias_values = widened_bias_.data();
  }
  if (weight.dtype == numerics::DType::kFloat32) {
    LinearForward(in, static_cast<const float*>(weight.data), bias_values, local_batch_, in_size,
                  out_size, out);
    return;
  }
  for (int64_t j = 0; j < local_batch_; ++j) {
    std::copy(bias_values, bias_values + out_size, out + j * out_size);
  }
  // Output columns [first, first + rows) come from weight rows [first, first + rows) alone.
  const int64_t tile_rows = WeightTileRows(in_size, out_size);
  for (int64_t first = 0; first < out_size; first += tile_rows) {
    const int64_t rows = std::min(tile_rows, out_size - first);
    WidenParameters(weight, first * in_size, rows * in_size, weight_tile_.data());
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(local_batch_),
                static_cast<int>(rows), static_cast<int>(in_size), 1.0f, in,
                static_cast<int>(in_size), weight_tile_.data(), static_cast<int>(in_size), 1.0f,
                out + first, static_cast<int>(out_size));
  }
}

void TeacherStudentMlp::StudentInputGradient(int64_t layer, const float* delta, float* previous) {
  const int64_t in_size = options_.layer_sizes[layer];
  const int64_t out_size = options_.layer_sizes[layer + 1];
  const StoredParameters& weight = student_weights_[layer];
  if (weight.dtype == numerics::DType::kFloat32) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(local_batch_),
                static_cast<int>(in_size), static_cast<int>(out_size), 1.0f, delta,
                static_cast<int>(out_size), static_cast<const float*>(weight.data),
                static_cast<int>(in_size), 0.0f, previous, static_cast<int>(in_size));
    return;
  }
  // previous = sum over row tiles of delta[:, tile] W[tile, :], the first tile overwriting.
  const int64_t tile_rows = WeightTileRows(in_size, out_size);
  for (int64_t first = 0; first < out_size; first += tile_rows) {
    const int64_t rows = std::min(tile_rows, out_size - first);
    WidenParameters(weight, first * in_size, rows * in_size, weight_tile_.data());
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(local_batch_),
                static_cast<int>(in_size), static_cast<int>(rows), 1.0f, delta + first,
                static_cast<int>(out_size), weight_tile_.data(), static_cast<int>(in_size),
                first == 0 ? 0.0f : 1.0f, previous, static_cast<int>(in_size));
  }
}

absl::StatusOr<double> TeacherStudentMlp::ForwardBackward(int64_t step, ParameterSource& params,
                                                          GradientSink& sink) {
  if (step < 0) return absl::InvalidArgumentError(absl::StrCat("step: negative, ", step));
  const std::vector<int64_t>& sizes = options_.layer_sizes;
  // The inputs and the teacher's targets need no student parameters: they come first, while the
  // engine may still be gathering those.
  LoadMicroBatch(step);
  for (int64_t l = 0; l < num_layers_; ++l) {
    // Each layer's parameters are asked for just before the layer runs, in forward order (the
    // weight, later in the tensor list, before the bias), so that only the buckets this layer
    // reads are waited for.
    ZS_ASSIGN_OR_RETURN(student_weights_[l],
                        CheckedMlpParameters(params, tensors_, BiasTensor(l) + 1));
    ZS_ASSIGN_OR_RETURN(student_biases_[l], CheckedMlpParameters(params, tensors_, BiasTensor(l)));
    float* out = activations_[l + 1].data();
    StudentLinearForward(l, activations_[l].data(), out);
    // Done with the layer's parameters until its backward (a zero3 engine may reuse their
    // buffer for the next layers).
    ZS_RETURN_IF_ERROR(params.ReleaseParameters(BiasTensor(l) + 1));
    ZS_RETURN_IF_ERROR(params.ReleaseParameters(BiasTensor(l)));
    if (l + 1 < num_layers_) ReluInPlace(out, local_batch_ * sizes[l + 1]);
  }

  // MSE over the micro-batch and the outputs; dLoss/dOutput = 2 (output - target) / count,
  // times the loss scale: backward runs on the scaled loss gradient (exact for the power-of-two
  // scales the engine uses, and a no-op at scale 1).
  const int64_t count = local_batch_ * sizes.back();
  const float* outputs = activations_[num_layers_].data();
  const float gradient_scale = static_cast<float>(2.0 / static_cast<double>(count));
  const float loss_scale = static_cast<float>(sink.loss_scale());
  float* delta = delta_[0].data();
  double squared_error = 0.0;
  for (int64_t k = 0; k < count; ++k) {
    const float diff = outputs[k] - targets_[k];
    squared_error += static_cast<double>(diff) * diff;
    delta[k] = diff * gradient_scale * loss_scale;
  }

  for (int64_t l = num_layers_ - 1; l >= 0; --l) {
    const int64_t in_size = sizes[l];
    const int64_t out_size = sizes[l + 1];
    const int64_t bias_tensor = BiasTensor(l);
    ZS_RETURN_IF_ERROR(ForEachGradSegment(
        sink, bias_tensor, out_size, [&](int64_t begin, int64_t end, absl::Span<float> bias_grad) {
          std::fill(bias_grad.begin(), bias_grad.end(), 0.0f);
          for (int64_t j = 0; j < local_batch_; ++j) {
            const float* row = delta + j * out_size;
            for (int64_t o = begin; o < end; ++o) bias_grad[o - begin] += row[o];
          }
          return absl::OkStatus();
        }));
    ZS_RETURN_IF_ERROR(WeightGradient(l, delta, sink));

    if (l == 0) break;
    // delta_prev[j, i] = (sum_o delta[j, o] * weight[o, i]) * relu'(activation[j, i]). The
    // weight is asked for again: forward released it.
    float* previous = delta_[(num_layers_ - l) % 2].data();
    ZS_ASSIGN_OR_RETURN(student_weights_[l],
                        CheckedMlpParameters(params, tensors_, BiasTensor(l) + 1));
    StudentInputGradient(l, delta, previous);
    ZS_RETURN_IF_ERROR(params.ReleaseParameters(BiasTensor(l) + 1));
    const float* activation = activations_[l].data();
    for (int64_t k = 0; k < local_batch_ * in_size; ++k) {
      if (!(activation[k] > 0.0f)) previous[k] = 0.0f;
    }
    delta = previous;
  }
  return squared_error / static_cast<double>(count);
}

int64_t TeacherStudentMlp::BufferBytes() const {
  int64_t floats = 0;
  auto add = [&floats](const std::vector<float>& buffer) {
    floats += static_cast<int64_t>(buffer.capacity());
  };
  for (const std::vector<float>& weights : teacher_weights_) add(weights);
  for (const std::vector<float>& biases : teacher_biases_) add(biases);
  for (const std::vector<float>& activation : activations_) add(activation);
  add(targets_);
  for (const std::vector<float>& scratch : teacher_scratch_) add(scratch);
  for (const std::vector<float>& delta : delta_) add(delta);
  add(row_grad_);
  add(weight_tile_);
  add(widened_bias_);
  return floats * static_cast<int64_t>(sizeof(float));
}

}  // namespace zeroshard::workloads
