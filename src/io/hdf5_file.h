// Small RAII layer over the HDF5 C API: identifiers that close themselves, files and
// groups that remember their path for error messages, attributes, strings, and tensors
// stored with `dtype` and `shape` attributes so h5dump and h5py users see what the bits
// are. Every failure becomes an exception naming the file and the object; HDF5's own
// error-stack printing is switched off and its deepest message is quoted instead.
#pragma once
#include <hdf5.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "tensor/dtype.h"
#include "tensor/tensor.h"

namespace tandem::hdf5 {

// Owns one HDF5 identifier and closes it with the matching H5?close function.
class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, Closer close) : id_(id), close_(close) {}
  Handle(Handle&& other) noexcept;
  Handle& operator=(Handle&& other) noexcept;
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle();

  hid_t get() const { return id_; }
  // Closes now and throws "what: <HDF5 reason>" when HDF5 reports a failure, which the
  // destructor cannot do.
  void close(const std::string& what);

 private:
  hid_t id_ = H5I_INVALID_HID;
  Closer close_ = nullptr;
};

// Throws std::runtime_error("what: <HDF5's deepest error message>") and clears the stack.
[[noreturn]] void fail(const std::string& what);
// Wrap an HDF5 return value: a negative identifier or status throws via fail(what).
Handle checked(hid_t id, Handle::Closer close, const std::string& what);
void check(herr_t status, const std::string& what);
bool check_bool(htri_t answer, const std::string& what);

// Names of groups, datasets and tensors may be nested ("a/b"); each component must be
// non-empty and not ".". Throws std::invalid_argument("where: invalid HDF5 name ...").
void validate_name(const std::string& name, const std::string& where);

// The HDF5 type tensors of `dtype` are stored as: native numbers for F64/F32/I*/U*, an
// IEEE half built from F32 for F16 (h5py reads it as float16), uint16 bits for BF16,
// uint8 bits for F8_*, and for BOOL the int8 enum {FALSE=0, TRUE=1} that h5py itself
// writes for numpy bool, so h5py hands back a bool array and h5dump prints TRUE/FALSE.
Handle file_type_of(DType dtype);

struct TensorInfo {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
};

// A file or a group inside one, with the file's path kept for messages.
class Group {
 public:
  Group(Handle handle, std::string file, std::string path_in_file);

  hid_t id() const { return handle_.get(); }
  const std::string& file() const { return file_; }
  const std::string& path_in_file() const { return path_; }

  // Names follow validate_name.
  bool contains(const std::string& name) const;
  Group group(const std::string& name) const;
  Group create_group(const std::string& name) const;
  Group require_group(const std::string& name) const;  // open, or create when absent
  // Every dataset below this group, as nested names relative to it, in name order.
  std::vector<std::string> dataset_names() const;
  void remove(const std::string& name) const;

  bool has_attribute(const std::string& name) const;
  void set_attribute(const std::string& name, const std::string& value) const;
  void set_attribute(const std::string& name, int64_t value) const;
  std::string string_attribute(const std::string& name) const;
  int64_t int_attribute(const std::string& name) const;
  // String attributes of the object `object` below this group (a dataset, say).
  bool object_has_attribute(const std::string& object, const std::string& name) const;
  void set_object_attribute(const std::string& object, const std::string& name, const std::string& value) const;
  std::string object_string_attribute(const std::string& object, const std::string& name) const;

  // Scalar UTF-8 string dataset (no 64 KiB attribute limit, so long texts fit).
  void write_string(const std::string& name, const std::string& text) const;
  std::string read_string(const std::string& name) const;
  // 1-D dataset of UTF-8 strings; h5py reads it as an array of str.
  void write_strings(const std::string& name, const std::vector<std::string>& texts) const;
  std::vector<std::string> read_strings(const std::string& name) const;

  // `tensor` must be a contiguous CPU tensor; the dataset gets attributes dtype and shape.
  void write_tensor(const std::string& name, const Tensor& tensor) const;
  // A tensor's dataset (dtype and shape attributes as write_tensor) whose contiguous
  // storage is allocated now, never filled by HDF5, and left for the caller to write
  // straight into the file at the returned byte offset, `bytes` long, while the file is
  // still open (large writes at the disk's rate, outside HDF5's global lock). Returns
  // bytes = 0 (and no offset) for an empty tensor.
  struct RawStorage {
    uint64_t offset = 0;
    size_t bytes = 0;
  };
  RawStorage create_raw_tensor(const std::string& name, DType dtype, const std::vector<int64_t>& shape) const;
  TensorInfo tensor_info(const std::string& name) const;
  // Fills `destination` (contiguous CPU memory) after checking that the stored dtype and
  // shape are the ones it describes; a mismatch names the file, the tensor, both values.
  void read_tensor(const std::string& name, const Tensor& destination) const;

 protected:
  std::string describe(const std::string& name) const;  // "/metrics/loss"

  Handle handle_;
  std::string file_;
  std::string path_;
};

// Every object of at least `threshold` bytes (a large dataset's storage) starts at a
// multiple of `alignment` bytes in the file (H5Pset_alignment), for a writer that writes
// that storage with O_DIRECT. The default, 1 and 1, aligns nothing.
struct FileAlignment {
  uint64_t threshold = 1;
  uint64_t alignment = 1;
};

class File : public Group {
 public:
  enum class Access { ReadOnly, ReadWrite };
  static File create(const std::filesystem::path& path, FileAlignment alignment = {});  // replaces an existing file
  static File open(const std::filesystem::path& path, Access access);

  void flush() const;
  // Closes for real (data on its way to the OS) and throws if HDF5 fails or an object of
  // the file is still open, which would keep the file open behind the caller's back.
  void close();

 private:
  using Group::Group;
};

}  // namespace tandem::hdf5
