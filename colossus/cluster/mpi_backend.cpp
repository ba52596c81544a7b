#include "colossus/cluster/mpi_backend.h"

#include "colossus/cluster/process_group.h"
#include "colossus/core/errors.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <fmt/format.h>

#include <cstdlib>
#include <numeric>

namespace colossus::cluster {

namespace {

std::string mpi_error_string(int code) {
  char buffer[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, buffer, &length);
  return std::string(buffer, length);
}

void check_mpi(int code, const char* call) {
  if (code != MPI_SUCCESS) {
    throw DistError(fmt::format("{} failed: {}", call, mpi_error_string(code)));
  }
}

// MPI has no 16-bit float types: they travel as 2-byte opaque elements and are
// reduced by our own ops, accumulating each pair in fp32.
MPI_Datatype two_byte_type() {
  static MPI_Datatype type = [] {
    MPI_Datatype t;
    MPI_Type_contiguous(2, MPI_BYTE, &t);
    MPI_Type_commit(&t);
    return t;
  }();
  return type;
}

template <typename T, typename F>
void reduce_16bit(void* in, void* inout, int* len, F combine) {
  auto* a = static_cast<T*>(in);
  auto* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = T(combine(static_cast<float>(a[i]), static_cast<float>(b[i])));
}

template <typename T>
MPI_Op make_16bit_op(c10d::ReduceOp::RedOpType op) {
  MPI_User_function* fn = nullptr;
  switch (op) {
    case c10d::ReduceOp::SUM:
    case c10d::ReduceOp::AVG:
      fn = [](void* in, void* io, int* n, MPI_Datatype*) {
        reduce_16bit<T>(in, io, n, [](float x, float y) { return x + y; });
      };
      break;
    case c10d::ReduceOp::PRODUCT:
      fn = [](void* in, void* io, int* n, MPI_Datatype*) {
        reduce_16bit<T>(in, io, n, [](float x, float y) { return x * y; });
      };
      break;
    case c10d::ReduceOp::MAX:
      fn = [](void* in, void* io, int* n, MPI_Datatype*) {
        reduce_16bit<T>(in, io, n, [](float x, float y) { return x > y ? x : y; });
      };
      break;
    case c10d::ReduceOp::MIN:
      fn = [](void* in, void* io, int* n, MPI_Datatype*) {
        reduce_16bit<T>(in, io, n, [](float x, float y) { return x < y ? x : y; });
      };
      break;
    default: throw DistError(fmt::format("reduce op {} is not supported by the MPI backend", static_cast<int>(op)));
  }
  MPI_Op mpi_op;
  MPI_Op_create(fn, /*commute=*/1, &mpi_op);
  return mpi_op;
}

MPI_Datatype mpi_type(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return MPI_FLOAT;
    case at::kDouble: return MPI_DOUBLE;
    case at::kInt: return MPI_INT32_T;
    case at::kLong: return MPI_INT64_T;
    case at::kShort: return MPI_INT16_T;
    case at::kChar: return MPI_INT8_T;
    case at::kByte: return MPI_UINT8_T;
    case at::kBool: return MPI_C_BOOL;
    case at::kHalf:
    case at::kBFloat16: return two_byte_type();
    default:
      throw DistError(fmt::format("dtype {} is not supported by the MPI backend; use float32, "
                                  "float64, float16, bfloat16 or an integer type",
                                  c10::toString(type)));
  }
}

MPI_Op mpi_op(c10d::ReduceOp::RedOpType op, at::ScalarType type) {
  if (type == at::kHalf || type == at::kBFloat16) {
    // One op per (dtype, reduction), created on first use.
    static std::mutex mutex;
    static std::map<std::pair<int, int>, MPI_Op> ops;
    std::lock_guard<std::mutex> lock(mutex);
    auto key = std::make_pair(static_cast<int>(type), static_cast<int>(op));
    auto it = ops.find(key);
    if (it != ops.end()) return it->second;
    MPI_Op created = type == at::kHalf ? make_16bit_op<c10::Half>(op) : make_16bit_op<c10::BFloat16>(op);
    ops.emplace(key, created);
    return created;
  }
  switch (op) {
    case c10d::ReduceOp::SUM:
    case c10d::ReduceOp::AVG: return type == at::kBool ? MPI_LOR : MPI_SUM;
    case c10d::ReduceOp::PRODUCT: return type == at::kBool ? MPI_LAND : MPI_PROD;
    case c10d::ReduceOp::MAX: return type == at::kBool ? MPI_LOR : MPI_MAX;
    case c10d::ReduceOp::MIN: return type == at::kBool ? MPI_LAND : MPI_MIN;
    default: throw DistError(fmt::format("reduce op {} is not supported by the MPI backend", static_cast<int>(op)));
  }
}

void check_tensor(const at::Tensor& t, const char* what) {
  if (!t.defined()) throw DistError(fmt::format("{}: tensor is undefined", what));
  if (!t.device().is_cpu()) {
    throw DistError(fmt::format("{}: the MPI backend takes CPU tensors, got one on {}; use the "
                                "NCCL backend for GPU tensors",
                                what, t.device().str()));
  }
  if (!t.is_contiguous()) {
    throw DistError(fmt::format("{}: tensor must be contiguous (call .contiguous() first)", what));
  }
  (void)mpi_type(t.scalar_type());  // refuse unsupported dtypes here, not later on the worker
}

void check_single(const std::vector<at::Tensor>& tensors, const char* what) {
  if (tensors.size() != 1) {
    throw DistError(fmt::format("{}: the MPI backend takes exactly one tensor, got {}", what, tensors.size()));
  }
  check_tensor(tensors[0], what);
}

int to_count(int64_t numel, const char* what) {
  if (numel > std::numeric_limits<int>::max()) {
    throw DistError(fmt::format("{}: {} elements exceed MPI's int count limit; split the buffer", what, numel));
  }
  return static_cast<int>(numel);
}

// Divides in place after a SUM when the caller asked for AVG.
void finish_average(at::Tensor& t, c10d::ReduceOp::RedOpType op, int size) {
  if (op == c10d::ReduceOp::AVG) {
    if (at::isIntegralType(t.scalar_type(), /*includeBool=*/true)) {
      t.div_(size, "floor");
    } else {
      t.div_(size);
    }
  }
}

class MpiWork : public c10d::Work {
 public:
  explicit MpiWork(c10d::OpType op) : c10d::Work(-1, op) {}
  void complete(std::exception_ptr error) { finish(std::move(error)); }
};

// A non-blocking point-to-point request; keeps its tensor alive until done.
class MpiRequestWork : public c10d::Work {
 public:
  MpiRequestWork(c10d::OpType op, MPI_Request request, at::Tensor tensor)
      : c10d::Work(-1, op), request_(request), tensor_(std::move(tensor)) {}
  ~MpiRequestWork() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!done_ && !finalized) MPI_Wait(&request_, MPI_STATUS_IGNORE);
  }
  bool isCompleted() override {
    std::lock_guard<std::mutex> lock(request_mutex_);
    if (!done_) {
      int flag = 0;
      check_mpi(MPI_Test(&request_, &flag, MPI_STATUS_IGNORE), "MPI_Test");
      done_ = flag != 0;
    }
    return done_;
  }
  bool wait(std::chrono::milliseconds /*timeout*/) override {
    std::lock_guard<std::mutex> lock(request_mutex_);
    if (!done_) {
      check_mpi(MPI_Wait(&request_, MPI_STATUS_IGNORE), "MPI_Wait");
      done_ = true;
    }
    return true;
  }

 private:
  std::mutex request_mutex_;
  MPI_Request request_;
  at::Tensor tensor_;
  bool done_ = false;
};

struct MpiRuntime {
  MpiRuntime() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
      if (provided < MPI_THREAD_MULTIPLE) {
        throw DistError(fmt::format("this MPI provides thread level {}, Colossus needs MPI_THREAD_MULTIPLE ({})",
                                    provided, static_cast<int>(MPI_THREAD_MULTIPLE)));
      }
      owns = true;
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  }
  ~MpiRuntime() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owns && !finalized) MPI_Finalize();
  }
  bool owns = false;
};

MpiRuntime& runtime() {
  static MpiRuntime instance;
  return instance;
}

ProcessGroupPtr mpi_split(const ProcessGroup& parent, int color, int key, const std::string& name) {
  auto* backend = dynamic_cast<MpiBackend*>(parent.backend().get());
  if (backend == nullptr) throw DistError("mpi_split called on a group that is not MPI");
  MPI_Comm child;
  check_mpi(MPI_Comm_split(backend->comm(), color, key, &child), "MPI_Comm_split");
  MPI_Comm_set_errhandler(child, MPI_ERRORS_RETURN);
  int child_size = 0;
  MPI_Comm_size(child, &child_size);
  // World rank of each member, in child-rank order.
  int my_world = parent.global_rank(parent.rank());
  std::vector<int> members(child_size);
  check_mpi(MPI_Allgather(&my_world, 1, MPI_INT, members.data(), 1, MPI_INT, child), "MPI_Allgather");
  auto child_backend = c10::make_intrusive<MpiBackend>(child);
  return std::make_shared<ProcessGroup>(child_backend, std::move(members), name, mpi_split);
}

}  // namespace

bool launched_by_mpi() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_SIZE") != nullptr ||
         std::getenv("PMIX_RANK") != nullptr;
}

void ensure_mpi_initialized() { (void)runtime(); }

MpiBackend::MpiBackend(MPI_Comm comm)
    : c10d::Backend([comm] {
        ensure_mpi_initialized();
        int rank = 0;
        MPI_Comm_rank(comm, &rank);
        return rank;
      }(),
                    [comm] {
                      int size = 0;
                      MPI_Comm_size(comm, &size);
                      return size;
                    }()),
      comm_(comm) {
  worker_ = std::thread([this] { run_worker(); });
}

MpiBackend::~MpiBackend() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_WORLD && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void MpiBackend::run_worker() {
  while (true) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and drained
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

c10::intrusive_ptr<c10d::Work> MpiBackend::enqueue(c10d::OpType op, std::function<void()> fn) {
  auto work = c10::make_intrusive<MpiWork>(op);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.emplace_back([work, fn = std::move(fn)] {
      try {
        fn();
        work->complete(nullptr);
      } catch (...) {
        work->complete(std::current_exception());
      }
    });
  }
  cv_.notify_one();
  return work;
}

c10::intrusive_ptr<c10d::Work> MpiBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                     const c10d::BroadcastOptions& opts) {
  check_single(tensors, "broadcast");
  at::Tensor t = tensors[0];
  int root = static_cast<int>(opts.rootRank);
  return enqueue(c10d::OpType::BROADCAST, [this, t, root] {
    check_mpi(MPI_Bcast(t.data_ptr(), to_count(t.numel(), "broadcast"), mpi_type(t.scalar_type()), root, comm_),
              "MPI_Bcast");
  });
}

c10::intrusive_ptr<c10d::Work> MpiBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceOptions& opts) {
  check_single(tensors, "all_reduce");
  at::Tensor t = tensors[0];
  auto op = opts.reduceOp.op_;
  int size = getSize();
  return enqueue(c10d::OpType::ALLREDUCE, [this, t, op, size]() mutable {
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, t.data_ptr(), to_count(t.numel(), "all_reduce"),
                            mpi_type(t.scalar_type()), mpi_op(op, t.scalar_type()), comm_),
              "MPI_Allreduce");
    finish_average(t, op, size);
  });
}

c10::intrusive_ptr<c10d::Work> MpiBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                           const c10d::AllgatherOptions&) {
  check_tensor(output, "all_gather");
  check_tensor(input, "all_gather");
  if (output.scalar_type() != input.scalar_type()) {
    throw DistError(fmt::format("all_gather: output dtype {} differs from input dtype {}",
                                c10::toString(output.scalar_type()), c10::toString(input.scalar_type())));
  }
  at::Tensor out = output;
  at::Tensor in = input;
  return enqueue(c10d::OpType::_ALLGATHER_BASE, [this, out, in] {
    auto type = mpi_type(in.scalar_type());
    int count = to_count(in.numel(), "all_gather");
    check_mpi(MPI_Allgather(in.data_ptr(), count, type, out.data_ptr(), count, type, comm_), "MPI_Allgather");
  });
}

c10::intrusive_ptr<c10d::Work> MpiBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions&) {
  check_single(inputs, "all_gather");
  if (outputs.size() != 1 || static_cast<int>(outputs[0].size()) != getSize()) {
    throw DistError(fmt::format("all_gather: expected one list of {} output tensors", getSize()));
  }
  at::Tensor in = inputs[0];
  for (auto& o : outputs[0]) {
    if (o.numel() != in.numel() || o.scalar_type() != in.scalar_type()) {
      throw DistError(fmt::format("all_gather: every output must match the input ({} elements of {})",
                                  in.numel(), c10::toString(in.scalar_type())));
    }
  }
  std::vector<at::Tensor> outs = outputs[0];
  return enqueue(c10d::OpType::ALLGATHER, [this, outs, in] {
    at::Tensor flat = at::empty({in.numel() * static_cast<int64_t>(outs.size())}, in.options());
    auto type = mpi_type(in.scalar_type());
    int count = to_count(in.numel(), "all_gather");
    check_mpi(MPI_Allgather(in.data_ptr(), count, type, flat.data_ptr(), count, type, comm_), "MPI_Allgather");
    for (size_t r = 0; r < outs.size(); ++r) {
      at::Tensor dst = outs[r];
      dst.view({-1}).copy_(flat.narrow(0, static_cast<int64_t>(r) * in.numel(), in.numel()));
    }
  });
}

c10::intrusive_ptr<c10d::Work> MpiBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                const c10d::ReduceScatterOptions& opts) {
  check_tensor(output, "reduce_scatter");
  check_tensor(input, "reduce_scatter");
  at::Tensor out = output;
  at::Tensor in = input;
  auto op = opts.reduceOp.op_;
  int size = getSize();
  return enqueue(c10d::OpType::_REDUCE_SCATTER_BASE, [this, out, in, op, size]() mutable {
    check_mpi(MPI_Reduce_scatter_block(in.data_ptr(), out.data_ptr(), to_count(out.numel(), "reduce_scatter"),
                                       mpi_type(in.scalar_type()), mpi_op(op, in.scalar_type()), comm_),
              "MPI_Reduce_scatter_block");
    finish_average(out, op, size);
  });
}

c10::intrusive_ptr<c10d::Work> MpiBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                         std::vector<int64_t>& output_splits,
                                                         std::vector<int64_t>& input_splits,
                                                         const c10d::AllToAllOptions&) {
  check_tensor(output, "all_to_all");
  check_tensor(input, "all_to_all");
  int size = getSize();
  auto rows_of = [size](const at::Tensor& t, std::vector<int64_t> splits, const char* which) {
    int64_t rows = t.dim() == 0 ? 1 : t.size(0);
    if (splits.empty()) {
      if (rows % size != 0) {
        throw DistError(fmt::format("all_to_all: {} has {} rows, not divisible by the group size {}; "
                                    "pass explicit split sizes",
                                    which, rows, size));
      }
      splits.assign(size, rows / size);
    }
    int64_t total = std::accumulate(splits.begin(), splits.end(), int64_t{0});
    if (total != rows) {
      throw DistError(fmt::format("all_to_all: {} split sizes add up to {} rows but the tensor has {}",
                                  which, total, rows));
    }
    return splits;
  };
  auto out_rows = rows_of(output, output_splits, "output");
  auto in_rows = rows_of(input, input_splits, "input");
  int64_t out_row_numel = output.dim() == 0 ? 1 : output.numel() / std::max<int64_t>(output.size(0), 1);
  int64_t in_row_numel = input.dim() == 0 ? 1 : input.numel() / std::max<int64_t>(input.size(0), 1);
  at::Tensor out = output;
  at::Tensor in = input;
  return enqueue(c10d::OpType::ALLTOALL_BASE, [this, out, in, out_rows, in_rows, out_row_numel, in_row_numel, size] {
    std::vector<int> send_counts(size), send_displs(size), recv_counts(size), recv_displs(size);
    int64_t send_offset = 0, recv_offset = 0;
    for (int r = 0; r < size; ++r) {
      send_counts[r] = to_count(in_rows[r] * in_row_numel, "all_to_all");
      send_displs[r] = to_count(send_offset, "all_to_all");
      send_offset += in_rows[r] * in_row_numel;
      recv_counts[r] = to_count(out_rows[r] * out_row_numel, "all_to_all");
      recv_displs[r] = to_count(recv_offset, "all_to_all");
      recv_offset += out_rows[r] * out_row_numel;
    }
    auto type = mpi_type(in.scalar_type());
    check_mpi(MPI_Alltoallv(in.data_ptr(), send_counts.data(), send_displs.data(), type, out.data_ptr(),
                            recv_counts.data(), recv_displs.data(), type, comm_),
              "MPI_Alltoallv");
  });
}

// Point-to-point goes straight to MPI_Isend/MPI_Irecv on the caller's thread
// rather than through the ordered worker queue: two ranks that each send and
// then receive must not deadlock behind each other's blocking send.
c10::intrusive_ptr<c10d::Work> MpiBackend::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  check_single(tensors, "send");
  at::Tensor t = tensors[0];
  MPI_Request request;
  check_mpi(MPI_Isend(t.data_ptr(), to_count(t.numel(), "send"), mpi_type(t.scalar_type()), dst, tag, comm_,
                      &request),
            "MPI_Isend");
  return c10::make_intrusive<MpiRequestWork>(c10d::OpType::SEND, request, t);
}

c10::intrusive_ptr<c10d::Work> MpiBackend::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  check_single(tensors, "recv");
  at::Tensor t = tensors[0];
  MPI_Request request;
  check_mpi(MPI_Irecv(t.data_ptr(), to_count(t.numel(), "recv"), mpi_type(t.scalar_type()), src, tag, comm_,
                      &request),
            "MPI_Irecv");
  return c10::make_intrusive<MpiRequestWork>(c10d::OpType::RECV, request, t);
}

c10::intrusive_ptr<c10d::Work> MpiBackend::barrier(const c10d::BarrierOptions&) {
  return enqueue(c10d::OpType::BARRIER, [this] { check_mpi(MPI_Barrier(comm_), "MPI_Barrier"); });
}

std::shared_ptr<ProcessGroup> make_mpi_world_group() {
  ensure_mpi_initialized();
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::vector<int> ranks(size);
  std::iota(ranks.begin(), ranks.end(), 0);
  auto backend = c10::make_intrusive<MpiBackend>(MPI_COMM_WORLD);
  return std::make_shared<ProcessGroup>(backend, std::move(ranks), "world", mpi_split);
}

}  // namespace colossus::cluster
