// The CUDA backend of the memory pool, on CUDA virtual memory management: an address
// range is reserved once (cuMemAddressReserve); physical memory is created and mapped
// into it (cuMemCreate, cuMemMap, cuMemSetAccess) and unmapped on offload, so device
// pointers and CUDA graphs that captured them stay valid.
//
// libcuda is never linked (the binary must start where there is no driver): the driver
// entry points are fetched at run time through the runtime; <cuda.h> and
// <cudaTypedefs.h> only give their types.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "tensor/memory_pool_backend.h"
#include "tensor/pinned_host.h"

namespace tandem {

namespace {

void check(cudaError_t status, const std::string& what) {
  if (status != cudaSuccess)
    throw std::runtime_error(what + ": " + cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ")");
}

// The driver calls the pool uses. Their ABI dates from CUDA 10.2 and is requested as of
// CUDA 12.0, which every driver that runs this CUDA 13 runtime provides.
struct DriverApi {
  PFN_cuGetErrorString_v6000 get_error_string = nullptr;
  PFN_cuMemGetAllocationGranularity_v10020 get_granularity = nullptr;
  PFN_cuMemAddressReserve_v10020 address_reserve = nullptr;
  PFN_cuMemAddressFree_v10020 address_free = nullptr;
  PFN_cuMemCreate_v10020 create = nullptr;
  PFN_cuMemRelease_v10020 release = nullptr;
  PFN_cuMemMap_v10020 map = nullptr;
  PFN_cuMemUnmap_v10020 unmap = nullptr;
  PFN_cuMemSetAccess_v10020 set_access = nullptr;

  DriverApi() {
    load("cuGetErrorString", get_error_string);
    load("cuMemGetAllocationGranularity", get_granularity);
    load("cuMemAddressReserve", address_reserve);
    load("cuMemAddressFree", address_free);
    load("cuMemCreate", create);
    load("cuMemRelease", release);
    load("cuMemMap", map);
    load("cuMemUnmap", unmap);
    load("cuMemSetAccess", set_access);
  }

  void check(CUresult status, const std::string& what) const {
    if (status == CUDA_SUCCESS) return;
    const char* text = nullptr;
    if (get_error_string(status, &text) != CUDA_SUCCESS || !text) text = "unknown driver error";
    throw std::runtime_error(what + ": " + text + " (CUresult " + std::to_string(status) + ")");
  }

 private:
  template <class Function>
  static void load(const char* symbol, Function& function) {
    void* address = nullptr;
    cudaDriverEntryPointQueryResult found{};
    tandem::check(cudaGetDriverEntryPointByVersion(symbol, &address, 12000, cudaEnableDefault, &found),
                  std::string("looking up CUDA driver entry point ") + symbol);
    if (found != cudaDriverEntryPointSuccess || !address)
      throw std::runtime_error(std::string("the CUDA driver does not provide ") + symbol +
                               " (virtual memory management needs a driver for CUDA 12 or later)");
    function = reinterpret_cast<Function>(address);
  }
};

// Makes the pool's device current for the duration of a call and restores the caller's.
class OnDevice {
 public:
  explicit OnDevice(int index) {
    check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != index) check(cudaSetDevice(index), "cudaSetDevice(" + std::to_string(index) + ")");
  }
  ~OnDevice() { cudaSetDevice(previous_); }
  OnDevice(const OnDevice&) = delete;
  OnDevice& operator=(const OnDevice&) = delete;

 private:
  int previous_ = 0;
};

CUdeviceptr address(const void* pointer) { return reinterpret_cast<CUdeviceptr>(pointer); }

// Checked before the driver is looked up, so a machine without a GPU gets this message.
int existing_device(int index) {
  int count = 0;
  check(cudaGetDeviceCount(&count), "memory pool on cuda:" + std::to_string(index));
  if (index < 0 || index >= count)
    throw std::invalid_argument("memory pool: no CUDA device " + std::to_string(index) + " (" +
                                std::to_string(count) + " visible)");
  return index;
}

class CudaMemoryBackend final : public MemoryPoolBackend {
 public:
  explicit CudaMemoryBackend(int index) : index_(existing_device(index)) {
    OnDevice on(index_);
    properties_.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    properties_.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    properties_.location.id = index_;
    access_.location = properties_.location;
    access_.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    driver_.check(driver_.get_granularity(&granularity_, &properties_, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                  "cuMemGetAllocationGranularity on " + device_label());
    // Non-blocking: the pool's copies must not wait on unrelated work in the legacy
    // default stream; wait_for_device() orders them after the caller's kernels.
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate on " + device_label());
  }

  // No device switch here: a destructor must not throw, and the stream knows its device.
  ~CudaMemoryBackend() override { cudaStreamDestroy(stream_); }

  Device device() const override { return Device::CUDA; }
  std::string device_label() const override { return "cuda:" + std::to_string(index_); }
  size_t granularity() const override { return granularity_; }

  void* reserve(size_t bytes) override {
    OnDevice on(index_);
    CUdeviceptr base = 0;
    driver_.check(driver_.address_reserve(&base, bytes, granularity_, 0, 0),
                  "cuMemAddressReserve of " + std::to_string(bytes) + " bytes");
    return reinterpret_cast<void*>(base);
  }

  void free_range(void* base, size_t bytes) override {
    OnDevice on(index_);
    driver_.check(driver_.address_free(address(base), bytes), "cuMemAddressFree");
  }

  // The handle is released as soon as it is mapped: the mapping keeps the physical
  // memory alive and cuMemUnmap then frees it, so the backend tracks no handles.
  void map(void* base, size_t bytes, bool zeroed) override {
    OnDevice on(index_);
    CUmemGenericAllocationHandle handle{};
    driver_.check(driver_.create(&handle, bytes, &properties_, 0),
                  "cuMemCreate of " + std::to_string(bytes) + " bytes on " + device_label());
    CUresult status = driver_.map(address(base), bytes, 0, handle, 0);
    if (status == CUDA_SUCCESS) {
      status = driver_.set_access(address(base), bytes, &access_, 1);
      if (status != CUDA_SUCCESS) driver_.unmap(address(base), bytes);
    }
    driver_.release(handle);
    driver_.check(status, "cuMemMap/cuMemSetAccess of " + std::to_string(bytes) + " bytes");
    if (zeroed) {
      check(cudaMemsetAsync(base, 0, bytes, stream_), "zeroing " + std::to_string(bytes) + " mapped bytes");
      check(cudaStreamSynchronize(stream_), "zeroing mapped memory");
    }
  }

  void unmap(void* base, size_t bytes) override {
    OnDevice on(index_);
    driver_.check(driver_.unmap(address(base), bytes), "cuMemUnmap of " + std::to_string(bytes) + " bytes");
  }

  // Mapped: kernels may read an offloaded copy in place (MemoryPool::readable_data).
  void* host_alloc(size_t bytes) override {
    OnDevice on(index_);
    return allocate_pinned_host(bytes, /*device_mapped=*/true);
  }

  void host_free(void* host, size_t bytes) override {
    OnDevice on(index_);
    free_pinned_host(host, bytes);
  }

  void copy_to_host(void* host, const void* device, size_t bytes) override {
    copy(host, device, bytes, cudaMemcpyDeviceToHost);
  }
  void copy_to_device(void* device, const void* host, size_t bytes) override {
    copy(device, host, bytes, cudaMemcpyHostToDevice);
  }

  void wait_for_device() override {
    OnDevice on(index_);
    check(cudaDeviceSynchronize(), "waiting for " + device_label());
  }

 private:
  void copy(void* destination, const void* source, size_t bytes, cudaMemcpyKind kind) {
    OnDevice on(index_);
    const std::string what = std::string(kind == cudaMemcpyDeviceToHost ? "device-to-host" : "host-to-device") +
                             " copy of " + std::to_string(bytes) + " bytes";
    check(cudaMemcpyAsync(destination, source, bytes, kind, stream_), what);
    check(cudaStreamSynchronize(stream_), what);
  }

  int index_;
  DriverApi driver_;
  CUmemAllocationProp properties_{};
  CUmemAccessDesc access_{};
  size_t granularity_ = 0;
  cudaStream_t stream_ = nullptr;
};

}  // namespace

std::unique_ptr<MemoryPoolBackend> make_cuda_memory_backend(int device_index) {
  return std::make_unique<CudaMemoryBackend>(device_index);
}

}  // namespace tandem
