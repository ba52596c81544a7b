// Storage for the CUDA entry points (see cuda_slots.h); filled by colossus_cuda.
#include "colossus/kernels/cuda_slots.h"

namespace colossus::kernels {

CudaSlots& cuda_slots() {
  static CudaSlots slots;
  return slots;
}

}  // namespace colossus::kernels
