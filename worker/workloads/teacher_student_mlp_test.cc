// Tests of the teacher-student MLP workload: validation, the generator-driven data and weights,
// gradients against finite differences of a double-precision reference, W-independence of the
// data and of the averaged gradient, bitwise determinism, bf16/fp16 parameters widened a tile at
// a time, and that the seed preset trains.
#include "worker/workloads/teacher_student_mlp.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/process_memory.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "numerics/dtype.h"
#include "sharding/model_catalog.h"

namespace zeroshard::workloads {
namespace {

using ::testing::HasSubstr;

using Tensors = std::vector<std::vector<float>>;

// Parameters held per catalog tensor as fp32 values (tensors()), handed out as they are or, for
// bf16/fp16, as their values rounded to that dtype (rounded when the source is made).
class VectorParameterSource : public ParameterSource {
 public:
  explicit VectorParameterSource(Tensors tensors, numerics::DType dtype = numerics::DType::kFloat32)
      : tensors_(std::move(tensors)), dtype_(dtype) {
    if (dtype_ == numerics::DType::kFloat32) return;
    for (const std::vector<float>& tensor : tensors_) {
      std::vector<uint16_t> bits;
      for (float value : tensor) {
        bits.push_back(dtype_ == numerics::DType::kFloat16 ? numerics::FloatToHalf(value)
                                                           : numerics::FloatToBFloat16(value));
      }
      bits_.push_back(std::move(bits));
    }
  }
  absl::StatusOr<StoredParameters> Parameters(int64_t tensor) override {
    asked_.push_back(tensor);
    const int64_t size = static_cast<int64_t>(tensors_[tensor].size());
    if (dtype_ == numerics::DType::kFloat32) {
      return StoredParameters{tensors_[tensor].data(), dtype_, size};
    }
    return StoredParameters{bits_[tensor].data(), dtype_, size};
  }
  Tensors& tensors() { return tensors_; }
  // The tensors asked for, in order, since the last clear.
  std::vector<int64_t>& asked() { return asked_; }

 private:
  Tensors tensors_;
  const numerics::DType dtype_;
  std::vector<std::vector<uint16_t>> bits_;
  std::vector<int64_t> asked_;
};

// `tensors` rounded to `dtype` and widened back to fp32.
Tensors Rounded(Tensors tensors, numerics::DType dtype) {
  for (std::vector<float>& tensor : tensors) {
    for (float& value : tensor) {
      value = dtype == numerics::DType::kFloat16
                  ? numerics::HalfToFloat(numerics::FloatToHalf(value))
                  : numerics::BFloat16ToFloat(numerics::FloatToBFloat16(value));
    }
  }
  return tensors;
}

// Records every gradient and the order it came in. Segments end at multiples of `segment`
// elements (tensor-local), as bucket boundaries would cut them; checks the sink's contract.
class RecordingSink : public GradientSink {
 public:
  explicit RecordingSink(const std::vector<sharding::TensorSpec>& tensors,
                         int64_t segment = int64_t{1} << 40, double scale = 1.0)
      : segment_(segment), scale_(scale) {
    for (const sharding::TensorSpec& tensor : tensors) sizes_.push_back(tensor.num_elements);
  }
  double loss_scale() const override { return scale_; }
  int64_t GradSegmentEnd(int64_t tensor, int64_t begin) const override {
    const int64_t size = sizes_.at(tensor);
    return std::min(size, (begin / segment_ + 1) * segment_);
  }
  absl::StatusOr<absl::Span<float>> GradBuffer(int64_t tensor, int64_t begin,
                                               int64_t end) override {
    EXPECT_EQ(open_, -1) << "a segment is still open";
    EXPECT_EQ(end, GradSegmentEnd(tensor, begin));
    if (order.empty() || order.back() != tensor) {
      order.push_back(tensor);
      EXPECT_EQ(begin, 0) << "tensor " << tensor << " starts mid-way";
    } else {
      EXPECT_EQ(begin, next_) << "tensor " << tensor << " skips or repeats elements";
    }
    if (static_cast<int64_t>(gradients.size()) <= tensor) gradients.resize(tensor + 1);
    gradients[tensor].resize(sizes_.at(tensor), std::nanf(""));
    open_ = tensor;
    ++segments;
    return absl::MakeSpan(gradients[tensor]).subspan(begin, end - begin);
  }
  absl::Status GradWritten(int64_t tensor, int64_t begin, int64_t end) override {
    EXPECT_EQ(open_, tensor);
    open_ = -1;
    next_ = end;
    return absl::OkStatus();
  }
  std::vector<int64_t> order;
  Tensors gradients;
  int64_t segments = 0;

 private:
  const int64_t segment_;
  const double scale_;
  std::vector<int64_t> sizes_;
  int64_t open_ = -1;
  int64_t next_ = 0;
};

TeacherStudentMlpOptions Options(std::vector<int64_t> sizes, int64_t global_batch,
                                 int64_t world_size, int64_t rank, uint64_t seed = 5) {
  TeacherStudentMlpOptions options;
  options.layer_sizes = std::move(sizes);
  options.seed = seed;
  options.global_batch = global_batch;
  options.world_size = world_size;
  options.rank = rank;
  return options;
}

std::unique_ptr<TeacherStudentMlp> MakeWorkload(const TeacherStudentMlpOptions& options) {
  absl::StatusOr<std::unique_ptr<TeacherStudentMlp>> workload = TeacherStudentMlp::Create(options);
  EXPECT_TRUE(workload.ok()) << workload.status();
  return workload.ok() ? std::move(*workload) : nullptr;
}

Tensors InitialTensors(const TeacherStudentMlp& workload) {
  Tensors tensors;
  for (size_t t = 0; t < workload.tensors().size(); ++t) {
    tensors.emplace_back(workload.tensors()[t].num_elements);
    EXPECT_TRUE(workload.InitialParameters(t, absl::MakeSpan(tensors.back())).ok());
  }
  return tensors;
}

struct StepResult {
  double loss = 0.0;
  Tensors gradients;
};

StepResult RunStep(TeacherStudentMlp& workload, ParameterSource& params, int64_t step,
                   int64_t segment = int64_t{1} << 40, double loss_scale = 1.0) {
  RecordingSink sink(workload.tensors(), segment, loss_scale);
  absl::StatusOr<double> loss = workload.ForwardBackward(step, params, sink);
  EXPECT_TRUE(loss.ok()) << loss.status();
  return {loss.value_or(0.0), std::move(sink.gradients)};
}

// A double-precision reference of the MLP: per-layer weights [out, in] and biases, forward order.
struct DoubleMlp {
  std::vector<int64_t> sizes;
  std::vector<std::vector<double>> weights;
  std::vector<std::vector<double>> biases;

  std::vector<double> Forward(const std::vector<double>& input) const {
    std::vector<double> activation = input;
    for (size_t l = 0; l + 1 < sizes.size(); ++l) {
      std::vector<double> next(biases[l]);
      for (int64_t o = 0; o < sizes[l + 1]; ++o) {
        for (int64_t i = 0; i < sizes[l]; ++i) {
          next[o] += weights[l][o * sizes[l] + i] * activation[i];
        }
        if (l + 2 < sizes.size()) next[o] = std::max(next[o], 0.0);
      }
      activation = std::move(next);
    }
    return activation;
  }
};

std::vector<double> ToDouble(absl::Span<const float> values) {
  return std::vector<double>(values.begin(), values.end());
}

DoubleMlp TeacherInDouble(const std::vector<int64_t>& sizes, uint64_t seed) {
  DoubleMlp teacher{sizes, {}, {}};
  for (size_t l = 0; l + 1 < sizes.size(); ++l) {
    std::vector<float> weight(sizes[l] * sizes[l + 1]);
    std::vector<float> bias(sizes[l + 1]);
    EXPECT_TRUE(
        FillLayerParameters(MlpRole::kTeacher, sizes, seed, l, false, absl::MakeSpan(weight)).ok());
    EXPECT_TRUE(
        FillLayerParameters(MlpRole::kTeacher, sizes, seed, l, true, absl::MakeSpan(bias)).ok());
    teacher.weights.push_back(ToDouble(weight));
    teacher.biases.push_back(ToDouble(bias));
  }
  return teacher;
}

// The student in double from catalog-ordered tensors.
DoubleMlp StudentInDouble(const std::vector<int64_t>& sizes, const Tensors& tensors) {
  const int64_t layers = static_cast<int64_t>(sizes.size()) - 1;
  DoubleMlp student{sizes, {}, {}};
  for (int64_t l = 0; l < layers; ++l) {
    const int64_t bias_tensor = 2 * (layers - 1 - l);
    student.biases.push_back(ToDouble(tensors[bias_tensor]));
    student.weights.push_back(ToDouble(tensors[bias_tensor + 1]));
  }
  return student;
}

// Mean squared error of `student` against `teacher` over the given samples, in double.
double ReferenceLoss(const DoubleMlp& student, const DoubleMlp& teacher, uint64_t seed,
                     const std::vector<int64_t>& samples) {
  double sum = 0.0;
  int64_t count = 0;
  std::vector<float> input(student.sizes[0]);
  for (int64_t sample : samples) {
    FillSampleInput(student.sizes, seed, sample, absl::MakeSpan(input));
    const std::vector<double> x = ToDouble(input);
    const std::vector<double> prediction = student.Forward(x);
    const std::vector<double> target = teacher.Forward(x);
    for (size_t k = 0; k < prediction.size(); ++k) {
      sum += (prediction[k] - target[k]) * (prediction[k] - target[k]);
      ++count;
    }
  }
  return sum / count;
}

double MaxAbs(const Tensors& tensors) {
  double max_abs = 0.0;
  for (const auto& tensor : tensors) {
    for (float value : tensor) max_abs = std::max(max_abs, std::fabs(static_cast<double>(value)));
  }
  return max_abs;
}

// First in the file, before other tests leave freed heap memory behind for the workload to reuse.
TEST(TeacherStudentMlpTest, BufferBytesIsTheMemoryItHoldsAndStepsAddNothing) {
  if (!common::RssFollowsAllocations()) GTEST_SKIP() << "RSS is the sanitizer's here";
  constexpr int64_t kMiB = 1024 * 1024;
  const TeacherStudentMlpOptions options = Options({1024, 2048, 2048}, 256, 1, 0);
  absl::StatusOr<common::ProcessMemory> before = common::ReadProcessMemory();
  ASSERT_TRUE(before.ok()) << before.status();
  std::unique_ptr<TeacherStudentMlp> workload = MakeWorkload(options);
  ASSERT_NE(workload, nullptr);
  absl::StatusOr<common::ProcessMemory> created = common::ReadProcessMemory();
  ASSERT_TRUE(created.ok()) << created.status();
  const int64_t counted = workload->BufferBytes();
  int64_t model_elements = 0;
  for (const sharding::TensorSpec& tensor : workload->tensors()) {
    model_elements += tensor.num_elements;
  }
  // A full fp32 teacher, plus activations and scratch.
  EXPECT_GT(counted, 4 * model_elements);
  const int64_t growth = created->vmrss_bytes - before->vmrss_bytes;
  EXPECT_GE(growth, counted * 85 / 100) << "counted " << counted;
  EXPECT_LE(growth, counted * 110 / 100) << "counted " << counted;

  // A step after the first (which warms up OpenBLAS's own buffers) touches no new memory.
  VectorParameterSource params(InitialTensors(*workload));
  RecordingSink sink(workload->tensors());
  ASSERT_TRUE(workload->ForwardBackward(0, params, sink).ok());
  const absl::Status reset = common::ResetPeakResidentMemory();
  if (absl::IsUnavailable(reset)) GTEST_SKIP() << "cannot reset the peak RSS here: " << reset;
  ASSERT_TRUE(reset.ok()) << reset;
  absl::StatusOr<common::ProcessMemory> warm = common::ReadProcessMemory();
  ASSERT_TRUE(warm.ok()) << warm.status();
  ASSERT_TRUE(workload->ForwardBackward(1, params, sink).ok());
  absl::StatusOr<common::ProcessMemory> stepped = common::ReadProcessMemory();
  ASSERT_TRUE(stepped.ok()) << stepped.status();
  EXPECT_LE(stepped->vmhwm_bytes - warm->vmrss_bytes, kMiB);
  EXPECT_EQ(workload->BufferBytes(), counted);
}

TEST(TeacherStudentMlpTest, CreateRejectsBadOptionsNamingTheField) {
  struct Case {
    TeacherStudentMlpOptions options;
    std::string field;
  };
  TeacherStudentMlpOptions bad_dataset = Options({10, 64, 10}, 128, 4, 0);
  bad_dataset.dataset_size = 0;
  const std::vector<Case> cases = {
      {Options({10}, 128, 4, 0), "layer_sizes"},
      {Options({10, 0, 10}, 128, 4, 0), "layer_sizes"},
      {Options({10, 64, 10}, 128, 0, 0), "world_size"},
      {Options({10, 64, 10}, 128, 4, 4), "rank"},
      {Options({10, 64, 10}, 128, 4, -1), "rank"},
      {Options({10, 64, 10}, 0, 1, 0), "global_batch"},
      {Options({10, 64, 10}, kMaxGlobalBatch + 1, 1, 0), "global_batch"},
      {Options({10, 64, 10}, 130, 4, 0), "global_batch"},
      {bad_dataset, "dataset_size"},
  };
  for (const Case& c : cases) {
    const absl::StatusOr<std::unique_ptr<TeacherStudentMlp>> workload =
        TeacherStudentMlp::Create(c.options);
    ASSERT_FALSE(workload.ok()) << c.field;
    EXPECT_EQ(workload.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(workload.status().message()), HasSubstr(c.field));
  }
}

TEST(TeacherStudentMlpTest, TensorsAreTheCatalogsAndInitialValuesFollowTheGenerator) {
  const std::vector<int64_t> sizes = {10, 64, 10};
  std::unique_ptr<TeacherStudentMlp> workload = MakeWorkload(Options(sizes, 128, 4, 1, 9));
  ASSERT_NE(workload, nullptr);
  EXPECT_EQ(workload->tensors(), *sharding::TensorsForLayerSizes(sizes));
  EXPECT_EQ(workload->local_batch(), 32);

  const Tensors initial = InitialTensors(*workload);
  // Catalog order: 2.bias, 2.weight, 0.bias, 0.weight.
  const std::vector<std::pair<int64_t, bool>> layer_and_bias = {
      {1, true}, {1, false}, {0, true}, {0, false}};
  for (size_t t = 0; t < initial.size(); ++t) {
    std::vector<float> expected(initial[t].size());
    ASSERT_TRUE(FillLayerParameters(MlpRole::kStudent, sizes, 9, layer_and_bias[t].first,
                                    layer_and_bias[t].second, absl::MakeSpan(expected))
                    .ok());
    EXPECT_EQ(initial[t], expected) << workload->tensors()[t].name;
    const float bound = 1.0f / std::sqrt(static_cast<float>(sizes[layer_and_bias[t].first]));
    for (float value : initial[t]) EXPECT_LE(std::fabs(value), bound);
  }
  // Student and teacher differ.
  std::vector<float> teacher(initial[3].size());
  ASSERT_TRUE(
      FillLayerParameters(MlpRole::kTeacher, sizes, 9, 0, false, absl::MakeSpan(teacher)).ok());
  EXPECT_NE(teacher, initial[3]);

  std::vector<float> wrong_size(3);
  EXPECT_EQ(workload->InitialParameters(0, absl::MakeSpan(wrong_size)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(workload->InitialParameters(4, absl::MakeSpan(wrong_size)).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TeacherStudentMlpTest, GradientsArriveInCatalogOrderWithTheirSizes) {
  std::unique_ptr<TeacherStudentMlp> workload = MakeWorkload(Options({3, 5, 4, 2}, 8, 2, 1));
  ASSERT_NE(workload, nullptr);
  VectorParameterSource params(InitialTensors(*workload));
  RecordingSink sink(workload->tensors());
  ASSERT_TRUE(workload->ForwardBackward(0, params, sink).ok());
  EXPECT_EQ(sink.order, (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
  for (size_t t = 0; t < workload->tensors().size(); ++t) {
    EXPECT_EQ(static_cast<int64_t>(sink.gradients[t].size()), workload->tensors()[t].num_elements);
  }
}

// Forward asks for each layer's tensors when the layer runs, in forward order (the tensor list
// backwards: weight, then bias), so that an engine still gathering the parameters is waited for
// layer by layer; backward asks again for the weights its input gradients read (layers 2 and 1:
// tensors 1 and 3), since forward released them (zero3); a failure to provide them ends the step
// before any gradient.
TEST(TeacherStudentMlpTest, ParametersAreAskedForLayerByLayerInForwardOrder) {
  std::unique_ptr<TeacherStudentMlp> workload = MakeWorkload(Options({3, 5, 4, 2}, 8, 2, 1));
  ASSERT_NE(workload, nullptr);
  VectorParameterSource params(InitialTensors(*workload));
  RecordingSink sink(workload->tensors());
  ASSERT_TRUE(workload->ForwardBackward(0, params, sink).ok());
  EXPECT_EQ(params.asked(), (std::vector<int64_t>{5, 4, 3, 2, 1, 0, 1, 3}));

  class FailingSource : public ParameterSource {
   public:
    explicit FailingSource(ParameterSource& valid) : valid_(valid) {}
    absl::StatusOr<StoredParameters> Parameters(int64_t tensor) override {
      if (tensor == 2) return absl::UnavailableError("all-gather of bucket 0 failed");
      return valid_.Parameters(tensor);
    }

   private:
    ParameterSource& valid_;
  } failing(params);
  RecordingSink untouched(workload->tensors());
  const absl::Status status = workload->ForwardBackward(1, failing, untouched).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(status.message()), HasSubstr("bucket 0"));
  EXPECT_EQ(untouched.segments, 0);
}

TEST(TeacherStudentMlpTest, SegmentedBackwardWritesTheSameGradients) {
  // Segments of 7 and 64 elements cut rows of every weight (input sizes 3, 50, 33) at the start,
  // in the middle and inside one row; the gradients match the whole-tensor ones (the rows cut by
  // a boundary are computed one at a time, so BLAS may sum them in another order).
  const std::vector<int64_t> sizes = {50, 33, 70, 3};
  std::unique_ptr<TeacherStudentMlp> workload = MakeWorkload(Options(sizes, 16, 2, 1));
  ASSERT_NE(workload, nullptr);
  VectorParameterSource params(InitialTensors(*workload));
  const StepResult whole = RunStep(*workload, params, 3);
  for (const int64_t segment : {int64_t{7}, int64_t{64}}) {
    RecordingSink sink(workload->tensors(), segment);
    const absl::StatusOr<double> loss = workload->ForwardBackward(3, params, sink);
    ASSERT_TRUE(loss.ok()) << loss.status();
    EXPECT_EQ(*loss, whole.loss);
    int64_t expected_segments = 0;
    for (const sharding::TensorSpec& tensor : workload->tensors()) {
      expected_segments += (tensor.num_elements + segment - 1) / segment;
    }
    EXPECT_EQ(sink.segments, expected_segments);
    for (size_t t = 0; t < whole.gradients.size(); ++t) {
      ASSERT_EQ(sink.gradients[t].size(), whole.gradients[t].size());
      for (size_t i = 0; i < whole.gradients[t].size(); ++i) {
        EXPECT_NEAR(sink.gradients[t][i], whole.gradients[t][i],
                    1e-6f * std::max(1.0f, std::abs(whole.gradients[t][i])))
            << "segment " << segment << " tensor " << t << " element " << i;
      }
    }
  }
}

TEST(TeacherStudentMlpTest, BackwardStartsFromTheScaledLossGradient) {
  // A power-of-two loss scale multiplies every gradient exactly; the loss stays unscaled.
  std::unique_ptr<TeacherStudentMlp> workload = MakeWorkload(Options({10, 64, 10}, 8, 1, 0));
  ASSERT_NE(workload, nullptr);
  VectorParameterSource params(InitialTensors(*workload));
  const StepResult plain = RunStep(*workload, params, 1);
  const StepResult scaled = RunStep(*workload, params, 1, int64_t{1} << 40, 1024.0);
  EXPECT_EQ(scaled.loss, plain.loss);
  for (size_t t = 0; t < plain.gradients.size(); ++t) {
    for (size_t i = 0; i < plain.gradients[t].size(); ++i) {
      ASSERT_EQ(scaled.gradients[t][i], plain.gradients[t][i] * 1024.0f) << t << " " << i;
    }
  }
}

TEST(TeacherStudentMlpTest, ForwardBackwardReportsBadParametersStepsAndSinkErrors) {
  std::unique_ptr<TeacherStudentMlp> workload = MakeWorkload(Options({3, 5, 2}, 4, 1, 0));
  ASSERT_NE(workload, nullptr);
  VectorParameterSource params(InitialTensors(*workload));
  RecordingSink sink(workload->tensors());
  EXPECT_EQ(workload->ForwardBackward(-1, params, sink).status().code(),
            absl::StatusCode::kInvalidArgument);

  class FailingSink : public GradientSink {
   public:
    double loss_scale() const override { return 1.0; }
    int64_t GradSegmentEnd(int64_t, int64_t begin) const override { return begin + 1; }
    absl::StatusOr<absl::Span<float>> GradBuffer(int64_t, int64_t, int64_t) override {
      return absl::CancelledError("engine aborted");
    }
    absl::Status GradWritten(int64_t, int64_t, int64_t) override {
      return absl::CancelledError("engine aborted");
    }
  } failing;
  EXPECT_EQ(workload->ForwardBackward(0, params, failing).status().code(),
            absl::StatusCode::kCancelled);

  class InvalidDTypeSource : public ParameterSource {
   public:
    explicit InvalidDTypeSource(ParameterSource& valid) : valid_(valid) {}
    absl::StatusOr<StoredParameters> Parameters(int64_t tensor) override {
      absl::StatusOr<StoredParameters> stored = valid_.Parameters(tensor);
      if (stored.ok() && tensor == 3) stored->dtype = static_cast<numerics::DType>(7);
      return stored;
    }

   private:
    ParameterSource& valid_;
  } invalid_dtype(params);
  const absl::Status dtype_status = workload->ForwardBackward(0, invalid_dtype, sink).status();
  EXPECT_EQ(dtype_status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(dtype_status.message()), HasSubstr("0.weight"));

  params.tensors()[1].pop_back();
  const absl::Status status = workload->ForwardBackward(0, params, sink).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("2.weight"));
}

TEST(TeacherStudentMlpTest, WeightTilesHoldWholeRowsWithinTheBound) {
  EXPECT_EQ(WeightTileRows(300, 500), kWeightTileElems / 300);
  EXPECT_EQ(WeightTileRows(3, 300), 300);  // the whole weight fits in one tile
  EXPECT_EQ(WeightTileRows(70000, 3), 1);  // a row wider than the tile: one row at a time
  EXPECT_EQ(WeightTileRows(65536, 1024), 1);
  EXPECT_EQ(WeightTileRows(4096, 4096), 16);  // medium's hidden layer: 16 rows, 256 KiB
  for (int64_t in_size : {1, 7, 300, 4096, 65537, 1 << 20}) {
    const int64_t rows = WeightTileRows(in_size, 1 << 20);
    EXPECT_LE(rows * in_size, std::max(kWeightTileElems, in_size)) << in_size;
    EXPECT_GT((rows + 1) * in_size, kWeightTileElems) << in_size;
  }
}

// bf16/fp16 parameters give the loss and gradients of fp32 parameters holding their rounded
// values: the weights are widened exactly, a row tile at a time. Layer sizes make the first
// weight wider than a tile (one row per tile), the third span three tiles (218, 218 and 64 rows)
// and the others fit in one. Only the grouping of the sums changes (sgemm per tile, and backward
// adds the tiles' products), so the match is within fp32 rounding, 1e-5 of the largest value
// (seen: 3e-7); rounding the parameters themselves moves the gradients by more than 1e-4 (seen:
// bf16 0.2, fp16 7e-4).
TEST(TeacherStudentMlpTest, LowPrecisionParametersActAsTheirWidenedValues) {
  const std::vector<int64_t> sizes = {70000, 3, 300, 500, 7};
  std::unique_ptr<TeacherStudentMlp> workload = MakeWorkload(Options(sizes, 8, 2, 1));
  ASSERT_NE(workload, nullptr);
  const Tensors initial = InitialTensors(*workload);
  VectorParameterSource exact(initial);
  const StepResult unrounded = RunStep(*workload, exact, 3);
  for (numerics::DType dtype : {numerics::DType::kBFloat16, numerics::DType::kFloat16}) {
    SCOPED_TRACE(numerics::DTypeName(dtype));
    VectorParameterSource low(initial, dtype);
    VectorParameterSource widened(Rounded(initial, dtype));
    const StepResult from_low = RunStep(*workload, low, 3, /*segment=*/1000);
    const StepResult from_widened = RunStep(*workload, widened, 3, /*segment=*/1000);
    EXPECT_NEAR(from_low.loss, from_widened.loss, 1e-6 * from_widened.loss);
    // Largest differences relative to each tensor's largest gradient: from the tiling, and from
    // rounding the parameters.
    double tiling = 0.0;
    double rounding = 0.0;
    for (size_t t = 0; t < from_widened.gradients.size(); ++t) {
      const double largest = MaxAbs({from_widened.gradients[t]});
      ASSERT_GT(largest, 0.0) << t;
      ASSERT_EQ(from_low.gradients[t].size(), from_widened.gradients[t].size());
      for (size_t k = 0; k < from_widened.gradients[t].size(); ++k) {
        const double widened_value = from_widened.gradients[t][k];
        ASSERT_NEAR(from_low.gradients[t][k], widened_value, 1e-5 * largest)
            << workload->tensors()[t].name << "[" << k << "]";
        tiling = std::max(tiling, std::fabs(from_low.gradients[t][k] - widened_value) / largest);
        rounding =
            std::max(rounding, std::fabs(widened_value - unrounded.gradients[t][k]) / largest);
      }
    }
    RecordProperty(absl::StrCat(numerics::DTypeName(dtype), "_tiling"), absl::StrCat(tiling));
    RecordProperty(absl::StrCat(numerics::DTypeName(dtype), "_rounding"), absl::StrCat(rounding));
    EXPECT_GT(rounding, 1e-4);
  }
}

TEST(TeacherStudentMlpTest, LossAndGradientsMatchADoubleReferenceAndFiniteDifferences) {
  const std::vector<int64_t> sizes = {3, 5, 4, 2};
  const uint64_t seed = 21;
  const int64_t batch = 6;
  std::unique_ptr<TeacherStudentMlp> workload = MakeWorkload(Options(sizes, batch, 1, 0, seed));
  ASSERT_NE(workload, nullptr);
  VectorParameterSource params(InitialTensors(*workload));
  const int64_t step = 2;
  const StepResult result = RunStep(*workload, params, step);

  std::vector<int64_t> samples;
  for (int64_t j = 0; j < batch; ++j) samples.push_back(workload->SampleIndex(step, j));
  const DoubleMlp teacher = TeacherInDouble(sizes, seed);
  const DoubleMlp student = StudentInDouble(sizes, params.tensors());
  const double loss = ReferenceLoss(student, teacher, seed, samples);
  EXPECT_NEAR(result.loss, loss, 1e-5 * loss);

  // Central differences of the double loss, h = 1e-6: truncation and rounding errors are far
  // below fp32's, so the tolerance is fp32's: 1e-4 of the largest gradient plus 1e-6.
  const double tolerance = 1e-4 * MaxAbs(result.gradients) + 1e-6;
  const double h = 1e-6;
  const int64_t layers = static_cast<int64_t>(sizes.size()) - 1;
  for (size_t t = 0; t < result.gradients.size(); ++t) {
    const int64_t layer = layers - 1 - static_cast<int64_t>(t) / 2;
    const bool bias = t % 2 == 0;
    for (size_t k = 0; k < result.gradients[t].size(); ++k) {
      DoubleMlp plus = student;
      DoubleMlp minus = student;
      (bias ? plus.biases : plus.weights)[layer][k] += h;
      (bias ? minus.biases : minus.weights)[layer][k] -= h;
      const double numeric = (ReferenceLoss(plus, teacher, seed, samples) -
                              ReferenceLoss(minus, teacher, seed, samples)) /
                             (2 * h);
      EXPECT_NEAR(result.gradients[t][k], numeric, tolerance)
          << workload->tensors()[t].name << "[" << k << "]";
    }
  }
}

TEST(TeacherStudentMlpTest, SampleIndicesWrapAroundTheDataset) {
  TeacherStudentMlpOptions options = Options({3, 2}, 4, 2, 1);
  options.dataset_size = 5;
  std::unique_ptr<TeacherStudentMlp> workload = MakeWorkload(options);
  ASSERT_NE(workload, nullptr);
  // Step 1's global samples are 4, 5, 6, 7 mod 5; rank 1 takes the last two.
  EXPECT_EQ(workload->SampleIndex(1, 0), 1);
  EXPECT_EQ(workload->SampleIndex(1, 1), 2);
  // No overflow for huge steps: 2^62 = 4 (mod 5), so (2^62 * 4 + 2) mod 5 = (16 + 2) mod 5 = 3.
  EXPECT_EQ(workload->SampleIndex(int64_t{1} << 62, 0), 3);
}

// Rank r of W at step s takes the same samples, in the same order, as a W = 1 workload with
// global batch B / W at step s * W + r: the same data in the same shapes, hence bitwise equal
// losses and gradients. This holds only if sample i is the same whatever W is.
TEST(TeacherStudentMlpTest, MicroBatchesAreTheSameSamplesWhateverTheWorldSize) {
  const std::vector<int64_t> sizes = {10, 64, 10};
  const int64_t global_batch = 16;
  std::unique_ptr<TeacherStudentMlp> single = MakeWorkload(Options(sizes, global_batch, 1, 0));
  ASSERT_NE(single, nullptr);
  VectorParameterSource params(InitialTensors(*single));
  for (int64_t world_size : {1, 2, 4}) {
    const int64_t local = global_batch / world_size;
    std::unique_ptr<TeacherStudentMlp> unsharded = MakeWorkload(Options(sizes, local, 1, 0));
    ASSERT_NE(unsharded, nullptr);
    for (int64_t rank = 0; rank < world_size; ++rank) {
      std::unique_ptr<TeacherStudentMlp> ranked =
          MakeWorkload(Options(sizes, global_batch, world_size, rank));
      ASSERT_NE(ranked, nullptr);
      for (int64_t step : {0, 3, 70}) {
        for (int64_t j = 0; j < local; ++j) {
          EXPECT_EQ(ranked->SampleIndex(step, j), single->SampleIndex(step, rank * local + j));
        }
        const StepResult a = RunStep(*ranked, params, step);
        const StepResult b = RunStep(*unsharded, params, step * world_size + rank);
        EXPECT_EQ(a.loss, b.loss) << "W=" << world_size << " rank " << rank;
        EXPECT_EQ(a.gradients, b.gradients) << "W=" << world_size << " rank " << rank;
      }
    }
  }
}

// The engine averages the W ranks' gradients; that average is the whole batch's gradient, up to
// fp32 rounding (different summation shapes): within 1e-5 of the largest gradient element.
TEST(TeacherStudentMlpTest, MeanOfRankGradientsIsTheWholeBatchGradient) {
  const std::vector<int64_t> sizes = {10, 64, 10};
  const int64_t global_batch = 128;
  const int64_t step = 3;
  std::unique_ptr<TeacherStudentMlp> single = MakeWorkload(Options(sizes, global_batch, 1, 0));
  ASSERT_NE(single, nullptr);
  VectorParameterSource params(InitialTensors(*single));
  const StepResult whole = RunStep(*single, params, step);
  const double tolerance = 1e-5 * MaxAbs(whole.gradients);
  for (int64_t world_size : {2, 4}) {
    Tensors mean = whole.gradients;
    for (auto& tensor : mean) std::fill(tensor.begin(), tensor.end(), 0.0f);
    double mean_loss = 0.0;
    for (int64_t rank = 0; rank < world_size; ++rank) {
      std::unique_ptr<TeacherStudentMlp> ranked =
          MakeWorkload(Options(sizes, global_batch, world_size, rank));
      ASSERT_NE(ranked, nullptr);
      const StepResult part = RunStep(*ranked, params, step);
      mean_loss += part.loss / world_size;
      for (size_t t = 0; t < mean.size(); ++t) {
        for (size_t k = 0; k < mean[t].size(); ++k) {
          mean[t][k] += part.gradients[t][k] / static_cast<float>(world_size);
        }
      }
    }
    EXPECT_NEAR(mean_loss, whole.loss, 1e-6 * whole.loss);
    for (size_t t = 0; t < mean.size(); ++t) {
      for (size_t k = 0; k < mean[t].size(); ++k) {
        ASSERT_NEAR(mean[t][k], whole.gradients[t][k], tolerance)
            << "W=" << world_size << " " << single->tensors()[t].name << "[" << k << "]";
      }
    }
  }
}

TEST(TeacherStudentMlpTest, GradientsAreBitwiseDeterministic) {
  const TeacherStudentMlpOptions options = Options({512, 1024, 512}, 64, 4, 2);
  std::unique_ptr<TeacherStudentMlp> first = MakeWorkload(options);
  std::unique_ptr<TeacherStudentMlp> second = MakeWorkload(options);
  ASSERT_NE(first, nullptr);
  ASSERT_NE(second, nullptr);
  VectorParameterSource params(InitialTensors(*first));
  const StepResult a = RunStep(*first, params, 5);
  RunStep(*first, params, 6);
  const StepResult b = RunStep(*first, params, 5);
  const StepResult c = RunStep(*second, params, 5);
  EXPECT_GT(MaxAbs(a.gradients), 0.0);
  EXPECT_EQ(a.loss, b.loss);
  EXPECT_EQ(a.gradients, b.gradients);
  EXPECT_EQ(a.loss, c.loss);
  EXPECT_EQ(a.gradients, c.gradients);
}

// torch.optim.AdamW's update with its defaults (betas 0.9, 0.999, eps 1e-8, weight decay 0.01),
// in double, applied to fp32 parameters.
class AdamW {
 public:
  AdamW(const Tensors& shapes, double lr) : lr_(lr) {
    for (const auto& tensor : shapes) {
      m_.emplace_back(tensor.size(), 0.0);
      v_.emplace_back(tensor.size(), 0.0);
    }
  }
  void Step(const Tensors& gradients, Tensors& params) {
    ++t_;
    const double correction1 = 1.0 - std::pow(0.9, t_);
    const double correction2 = 1.0 - std::pow(0.999, t_);
    for (size_t i = 0; i < params.size(); ++i) {
      for (size_t k = 0; k < params[i].size(); ++k) {
        const double g = gradients[i][k];
        m_[i][k] = 0.9 * m_[i][k] + 0.1 * g;
        v_[i][k] = 0.999 * v_[i][k] + 0.001 * g * g;
        double p = params[i][k] * (1.0 - lr_ * 0.01);
        p -= lr_ * (m_[i][k] / correction1) / (std::sqrt(v_[i][k] / correction2) + 1e-8);
        params[i][k] = static_cast<float>(p);
      }
    }
  }

 private:
  double lr_;
  int t_ = 0;
  std::vector<std::vector<double>> m_;
  std::vector<std::vector<double>> v_;
};

// The recommended demo config of docs/workloads.md: preset seed, seed 0, global batch 128 of
// 1,024 samples, 80 steps (10 epochs), AdamW lr 0.01 with torch's defaults. The loss must fall
// at least 10x (the NumPy prototype measured ~85x).
TEST(TeacherStudentMlpTest, SeedPresetTrainsTenfoldWithAdamW) {
  const TeacherStudentMlpOptions options =
      Options(*sharding::PresetLayerSizes("seed"), 128, 1, 0, 0);
  std::unique_ptr<TeacherStudentMlp> workload = MakeWorkload(options);
  ASSERT_NE(workload, nullptr);
  VectorParameterSource params(InitialTensors(*workload));
  AdamW optimizer(params.tensors(), 0.01);
  double first_loss = 0.0;
  double last_loss = 0.0;
  for (int64_t step = 0; step < 80; ++step) {
    StepResult result = RunStep(*workload, params, step);
    if (step == 0) first_loss = result.loss;
    last_loss = result.loss;
    optimizer.Step(result.gradients, params.tensors());
  }
  RecordProperty("first_loss", absl::StrCat(first_loss));
  RecordProperty("last_loss", absl::StrCat(last_loss));
  EXPECT_GT(first_loss, 0.0);
  EXPECT_LE(last_loss * 10.0, first_loss) << first_loss << " -> " << last_loss;
}

// Issue 38's `deep` preset (18 Linear layers, 71M parameters) at the benchmarks' global batch (64,
// memory_bench's default) and W = 4: a step gives a finite positive loss and finite gradients of
// the catalog's sizes, and a small gradient step on the same micro-batch lowers the loss (the
// teacher is as deep as the student, so its targets stay finite and non-zero). Fails before the
// fix: there was no `deep` preset.
TEST(TeacherStudentMlpTest, DeepPresetStepsAtTheBenchmarksBatch) {
  const TeacherStudentMlpOptions options =
      Options(*sharding::PresetLayerSizes("deep"), 64, 4, 0, 0);
  std::unique_ptr<TeacherStudentMlp> workload = MakeWorkload(options);
  ASSERT_NE(workload, nullptr);
  EXPECT_EQ(workload->local_batch(), 16);
  VectorParameterSource params(InitialTensors(*workload));
  StepResult first = RunStep(*workload, params, 0);
  ASSERT_EQ(first.gradients.size(), workload->tensors().size());
  EXPECT_TRUE(std::isfinite(first.loss));
  EXPECT_GT(first.loss, 0.0);
  for (size_t t = 0; t < first.gradients.size(); ++t) {
    ASSERT_EQ(static_cast<int64_t>(first.gradients[t].size()), workload->tensors()[t].num_elements);
    for (float g : first.gradients[t]) ASSERT_TRUE(std::isfinite(g)) << workload->tensors()[t].name;
  }
  for (size_t t = 0; t < first.gradients.size(); ++t) {
    for (size_t i = 0; i < first.gradients[t].size(); ++i) {
      params.tensors()[t][i] -= 0.01f * first.gradients[t][i];
    }
  }
  const double again = RunStep(*workload, params, 0).loss;
  RecordProperty("first_loss", absl::StrCat(first.loss));
  RecordProperty("loss_after_one_sgd_step", absl::StrCat(again));
  EXPECT_LT(again, first.loss);
}

}  // namespace
}  // namespace zeroshard::workloads
