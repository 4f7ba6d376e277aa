#include "io/hdf5_file.h"

#include <algorithm>
#include <bit>
#include <stdexcept>
#include <utility>

namespace tandem::hdf5 {

// Tensors are written and read with the little-endian file types as memory types, so
// HDF5 never converts and the bits stay exact; that only holds on little-endian hosts.
static_assert(std::endian::native == std::endian::little, "tandem's HDF5 layer assumes a little-endian host");

namespace {

// HDF5 prints its error stack to stderr by default; tandem turns failures into
// exceptions instead. The setting is per thread in thread-safe builds of the library.
void silence_error_printing() {
  thread_local bool silenced = false;
  if (!silenced) {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    silenced = true;
  }
}

herr_t take_innermost_message(unsigned position, const H5E_error2_t* error, void* message) {
  if (position == 0 && error->desc) *static_cast<std::string*>(message) = error->desc;
  return 0;
}

std::string quoted(const std::string& name) { return "'" + name + "'"; }

// Datasets and groups with nested names get their missing parent groups created.
Handle link_creation_with_parents(const std::string& where) {
  Handle list = checked(H5Pcreate(H5P_LINK_CREATE), H5Pclose, where + ": cannot create a property list");
  check(H5Pset_create_intermediate_group(list.get(), 1), where + ": cannot set intermediate group creation");
  return list;
}

// Objects without modification times: the same contents make the same bytes, so two
// checkpoints of one state (a background and a synchronous write) are identical files.
Handle untimed_creation(hid_t list_class, const std::string& where) {
  Handle list = checked(H5Pcreate(list_class), H5Pclose, where + ": cannot create a property list");
  check(H5Pset_obj_track_times(list.get(), 0), where + ": cannot switch modification times off");
  return list;
}

Handle utf8_string_type(const std::string& where) {
  Handle type = checked(H5Tcopy(H5T_C_S1), H5Tclose, where + ": cannot copy the string type");
  check(H5Tset_size(type.get(), H5T_VARIABLE), where + ": cannot make a variable-length string type");
  check(H5Tset_cset(type.get(), H5T_CSET_UTF8), where + ": cannot set UTF-8");
  return type;
}

Handle scalar_space(const std::string& where) {
  return checked(H5Screate(H5S_SCALAR), H5Sclose, where + ": cannot create a scalar dataspace");
}

Handle simple_space(const std::vector<hsize_t>& dims, const std::string& where) {
  return checked(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose,
                 where + ": cannot create a dataspace");
}

std::vector<hsize_t> extents_of(hid_t space, const std::string& where) {
  const int rank = H5Sget_simple_extent_ndims(space);
  if (rank < 0) fail(where + ": cannot read the dataspace rank");
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  if (rank > 0 && H5Sget_simple_extent_dims(space, dims.data(), nullptr) < 0)
    fail(where + ": cannot read the dataspace extents");
  return dims;
}

std::vector<int64_t> to_shape(const std::vector<hsize_t>& dims) { return {dims.begin(), dims.end()}; }

// Attributes are replaced when they exist, so a writer can set one twice.
Handle create_attribute(hid_t object, const std::string& name, hid_t type, hid_t space, const std::string& where) {
  if (check_bool(H5Aexists(object, name.c_str()), where + ": cannot look up attribute " + quoted(name)))
    check(H5Adelete(object, name.c_str()), where + ": cannot replace attribute " + quoted(name));
  return checked(H5Acreate2(object, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose,
                 where + ": cannot create attribute " + quoted(name));
}

Handle open_attribute(hid_t object, const std::string& name, const std::string& where) {
  if (!check_bool(H5Aexists(object, name.c_str()), where + ": cannot look up attribute " + quoted(name)))
    throw std::runtime_error(where + ": attribute " + quoted(name) + " is missing");
  return checked(H5Aopen(object, name.c_str(), H5P_DEFAULT), H5Aclose,
                 where + ": cannot open attribute " + quoted(name));
}

void write_string_attribute(hid_t object, const std::string& name, const std::string& value, const std::string& where) {
  Handle type = utf8_string_type(where);
  Handle space = scalar_space(where);
  Handle attribute = create_attribute(object, name, type.get(), space.get(), where);
  const char* text = value.c_str();
  check(H5Awrite(attribute.get(), type.get(), &text), where + ": cannot write attribute " + quoted(name));
}

std::string read_string_attribute(hid_t object, const std::string& name, const std::string& where) {
  Handle attribute = open_attribute(object, name, where);
  Handle stored =
      checked(H5Aget_type(attribute.get()), H5Tclose, where + ": cannot read the type of attribute " + quoted(name));
  if (H5Tget_class(stored.get()) != H5T_STRING || H5Tis_variable_str(stored.get()) <= 0)
    throw std::runtime_error(where + ": attribute " + quoted(name) + " is not a variable-length string");
  // Read in the stored character set: HDF5 will not convert ASCII to UTF-8, and hand
  // edits (h5py, h5py's older versions, other tools) may write either.
  Handle type = utf8_string_type(where);
  check(H5Tset_cset(type.get(), H5Tget_cset(stored.get())), where + ": cannot set the character set");
  char* text = nullptr;
  check(H5Aread(attribute.get(), type.get(), &text), where + ": cannot read attribute " + quoted(name));
  std::string value = text ? text : "";
  H5free_memory(text);
  return value;
}

void write_int_attribute(hid_t object, const std::string& name, int64_t value, const std::string& where) {
  Handle space = scalar_space(where);
  Handle attribute = create_attribute(object, name, H5T_STD_I64LE, space.get(), where);
  check(H5Awrite(attribute.get(), H5T_NATIVE_INT64, &value), where + ": cannot write attribute " + quoted(name));
}

int64_t read_int_attribute(hid_t object, const std::string& name, const std::string& where) {
  Handle attribute = open_attribute(object, name, where);
  Handle stored =
      checked(H5Aget_type(attribute.get()), H5Tclose, where + ": cannot read the type of attribute " + quoted(name));
  Handle space = checked(H5Aget_space(attribute.get()), H5Sclose,
                         where + ": cannot read the dataspace of attribute " + quoted(name));
  if (H5Tget_class(stored.get()) != H5T_INTEGER || H5Sget_simple_extent_npoints(space.get()) != 1)
    throw std::runtime_error(where + ": attribute " + quoted(name) + " is not a single integer");
  int64_t value = 0;
  check(H5Aread(attribute.get(), H5T_NATIVE_INT64, &value), where + ": cannot read attribute " + quoted(name));
  return value;
}

void write_shape_attribute(hid_t dataset, const std::vector<int64_t>& shape, const std::string& where) {
  // A rank-0 tensor gets an empty shape array, which HDF5 stores as a null dataspace.
  Handle space = shape.empty() ? checked(H5Screate(H5S_NULL), H5Sclose, where + ": cannot create a null dataspace")
                               : simple_space({shape.size()}, where);
  Handle attribute = create_attribute(dataset, "shape", H5T_STD_I64LE, space.get(), where);
  if (!shape.empty())
    check(H5Awrite(attribute.get(), H5T_NATIVE_INT64, shape.data()), where + ": cannot write attribute 'shape'");
}

std::vector<int64_t> read_shape_attribute(hid_t dataset, const std::string& where) {
  Handle attribute = open_attribute(dataset, "shape", where);
  Handle space =
      checked(H5Aget_space(attribute.get()), H5Sclose, where + ": cannot read the dataspace of attribute 'shape'");
  const hssize_t count = H5Sget_simple_extent_npoints(space.get());
  if (count < 0) fail(where + ": cannot count the entries of attribute 'shape'");
  std::vector<int64_t> shape(static_cast<size_t>(count));
  if (count > 0)
    check(H5Aread(attribute.get(), H5T_NATIVE_INT64, shape.data()), where + ": cannot read attribute 'shape'");
  return shape;
}

void require_host_contiguous(const Tensor& tensor, const std::string& where) {
  if (tensor.device != Device::CPU)
    throw std::invalid_argument(where + ": tensor is on " + device_name(tensor.device) +
                                ", HDF5 I/O needs host memory");
  if (!tensor.is_contiguous())
    throw std::invalid_argument(where + ": tensor " + tensor.describe() + " is not contiguous");
  for (int64_t extent : tensor.shape)
    if (extent < 0) throw std::invalid_argument(where + ": negative extent in shape " + shape_string(tensor.shape));
  if (tensor.numel() > 0 && !tensor.data)
    throw std::invalid_argument(where + ": tensor " + tensor.describe() + " has no data pointer");
}

// A tensor's dataset, opened and checked against its dtype and shape attributes.
struct OpenTensor {
  Handle dataset;
  Handle type;
  TensorInfo info;
};

void write_string_dataset(const Group& group, const std::string& name, const std::vector<std::string>& texts,
                          Handle space, const std::string& where) {
  validate_name(name, group.file());
  Handle type = utf8_string_type(where);
  Handle links = link_creation_with_parents(where);
  Handle creation = untimed_creation(H5P_DATASET_CREATE, where);
  Handle dataset =
      checked(H5Dcreate2(group.id(), name.c_str(), type.get(), space.get(), links.get(), creation.get(), H5P_DEFAULT),
              H5Dclose, where + ": cannot create the dataset");
  std::vector<const char*> pointers;
  for (const auto& text : texts) pointers.push_back(text.c_str());
  if (!texts.empty())
    check(H5Dwrite(dataset.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, pointers.data()),
          where + ": cannot write the dataset");
}

OpenTensor open_tensor(const Group& group, const std::string& name) {
  const std::string where = group.file() + ": tensor " + quoted(name);
  if (!group.contains(name)) throw std::runtime_error(where + " is missing");
  OpenTensor opened;
  opened.dataset =
      checked(H5Dopen2(group.id(), name.c_str(), H5P_DEFAULT), H5Dclose, where + ": cannot open the dataset");
  const std::string dtype_text = read_string_attribute(opened.dataset.get(), "dtype", where);
  try {
    opened.info.dtype = dtype_from_name(dtype_text);
  } catch (const std::invalid_argument& error) {
    throw std::runtime_error(where + ": " + error.what());
  }
  opened.info.name = name;
  opened.info.shape = read_shape_attribute(opened.dataset.get(), where);
  Handle space = checked(H5Dget_space(opened.dataset.get()), H5Sclose, where + ": cannot read the dataspace");
  const std::vector<int64_t> stored_shape = to_shape(extents_of(space.get(), where));
  if (stored_shape != opened.info.shape)
    throw std::runtime_error(where + ": shape attribute " + shape_string(opened.info.shape) +
                             " disagrees with the dataset's extents " + shape_string(stored_shape));
  // Reading through a different type would make HDF5 convert values, so the stored type
  // must be exactly the one this dtype is written as.
  opened.type = file_type_of(opened.info.dtype);
  Handle stored_type = checked(H5Dget_type(opened.dataset.get()), H5Tclose, where + ": cannot read the dataset type");
  if (!check_bool(H5Tequal(stored_type.get(), opened.type.get()), where + ": cannot compare types"))
    throw std::runtime_error(where + ": stored as a " + std::to_string(H5Tget_size(stored_type.get())) +
                             "-byte HDF5 type that does not hold " + dtype_text + " bits");
  return opened;
}

// tandem needs no HDF5 file locks: only rank 0 writes, checkpoints appear by rename, and
// a lock would let a user's open h5py session make the run's next metrics append fail.
// Parallel file systems that refuse flock (Lustre without -o flock) would fail too.
Handle access_without_locking(const std::string& where) {
  Handle access = checked(H5Pcreate(H5P_FILE_ACCESS), H5Pclose, where + ": cannot create a file access list");
  check(H5Pset_file_locking(access.get(), 0, 1), where + ": cannot disable file locking");
  return access;
}

}  // namespace

// ---- Handle and error conversion ----

Handle::Handle(Handle&& other) noexcept : id_(std::exchange(other.id_, H5I_INVALID_HID)), close_(other.close_) {}

Handle& Handle::operator=(Handle&& other) noexcept {
  if (this != &other) {
    if (id_ >= 0 && close_) close_(id_);
    id_ = std::exchange(other.id_, H5I_INVALID_HID);
    close_ = other.close_;
  }
  return *this;
}

Handle::~Handle() {
  if (id_ >= 0 && close_) close_(id_);
}

void Handle::close(const std::string& what) {
  const hid_t id = std::exchange(id_, H5I_INVALID_HID);
  if (id >= 0 && close_) check(close_(id), what);
}

void fail(const std::string& what) {
  std::string reason;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, take_innermost_message, &reason);
  H5Eclear2(H5E_DEFAULT);
  throw std::runtime_error(reason.empty() ? what : what + ": " + reason);
}

Handle checked(hid_t id, Handle::Closer close, const std::string& what) {
  if (id < 0) fail(what);
  return Handle(id, close);
}

void check(herr_t status, const std::string& what) {
  if (status < 0) fail(what);
}

bool check_bool(htri_t answer, const std::string& what) {
  if (answer < 0) fail(what);
  return answer > 0;
}

void validate_name(const std::string& name, const std::string& where) {
  bool valid = !name.empty() && name.front() != '/' && name.back() != '/';
  size_t start = 0;
  while (valid && start <= name.size()) {
    const size_t end = std::min(name.find('/', start), name.size());
    const std::string component = name.substr(start, end - start);
    valid = !component.empty() && component != ".";
    start = end + 1;
  }
  if (!valid)
    throw std::invalid_argument(where + ": invalid HDF5 name " + quoted(name) +
                                " (components must be non-empty, not '.', joined by single '/')");
}

Handle file_type_of(DType dtype) {
  silence_error_printing();
  const std::string where = std::string("HDF5 type for ") + dtype_name(dtype);
  auto copy = [&](hid_t type) { return checked(H5Tcopy(type), H5Tclose, where + ": cannot copy a type"); };
  switch (dtype) {
    case DType::F64:
      return copy(H5T_IEEE_F64LE);
    case DType::F32:
      return copy(H5T_IEEE_F32LE);
    case DType::F16: {
      // The layout h5py uses for numpy float16: sign bit 15, 5 exponent bits at 10,
      // 10 mantissa bits, bias 15.
      Handle half = copy(H5T_IEEE_F32LE);
      check(H5Tset_fields(half.get(), 15, 10, 5, 0, 10), where + ": cannot set the float fields");
      check(H5Tset_size(half.get(), 2), where + ": cannot set the size");
      check(H5Tset_ebias(half.get(), 15), where + ": cannot set the exponent bias");
      return half;
    }
    case DType::BF16:
      return copy(H5T_STD_U16LE);
    case DType::F8_E4M3:
    case DType::F8_E5M2:
      return copy(H5T_STD_U8LE);
    case DType::I64:
      return copy(H5T_STD_I64LE);
    case DType::I32:
      return copy(H5T_STD_I32LE);
    case DType::I16:
      return copy(H5T_STD_I16LE);
    case DType::I8:
      return copy(H5T_STD_I8LE);
    case DType::U64:
      return copy(H5T_STD_U64LE);
    case DType::U32:
      return copy(H5T_STD_U32LE);
    case DType::U16:
      return copy(H5T_STD_U16LE);
    case DType::U8:
      return copy(H5T_STD_U8LE);
    case DType::BOOL: {
      Handle boolean = checked(H5Tenum_create(H5T_STD_I8LE), H5Tclose, where + ": cannot create an enum type");
      const int8_t no = 0, yes = 1;
      check(H5Tenum_insert(boolean.get(), "FALSE", &no), where + ": cannot add FALSE");
      check(H5Tenum_insert(boolean.get(), "TRUE", &yes), where + ": cannot add TRUE");
      return boolean;
    }
  }
  throw std::invalid_argument(where + ": no HDF5 type for this dtype");
}

// ---- Group ----

Group::Group(Handle handle, std::string file, std::string path_in_file)
    : handle_(std::move(handle)), file_(std::move(file)), path_(std::move(path_in_file)) {}

std::string Group::describe(const std::string& name) const { return path_ == "/" ? "/" + name : path_ + "/" + name; }

bool Group::contains(const std::string& name) const {
  validate_name(name, file_);
  // H5Lexists fails rather than answering false when a parent is missing, so walk down.
  for (size_t end = name.find('/');; end = name.find('/', end + 1)) {
    const std::string prefix = name.substr(0, end);
    if (!check_bool(H5Lexists(id(), prefix.c_str(), H5P_DEFAULT), file_ + ": cannot look up " + describe(prefix)))
      return false;
    if (end == std::string::npos) return true;
  }
}

Group Group::group(const std::string& name) const {
  validate_name(name, file_);
  if (!contains(name)) throw std::runtime_error(file_ + ": group " + describe(name) + " is missing");
  return Group(
      checked(H5Gopen2(id(), name.c_str(), H5P_DEFAULT), H5Gclose, file_ + ": cannot open group " + describe(name)),
      file_, describe(name));
}

Group Group::create_group(const std::string& name) const {
  validate_name(name, file_);
  Handle links = link_creation_with_parents(file_);
  Handle creation = untimed_creation(H5P_GROUP_CREATE, file_);
  return Group(checked(H5Gcreate2(id(), name.c_str(), links.get(), creation.get(), H5P_DEFAULT), H5Gclose,
                       file_ + ": cannot create group " + describe(name)),
               file_, describe(name));
}

Group Group::require_group(const std::string& name) const { return contains(name) ? group(name) : create_group(name); }

std::vector<std::string> Group::dataset_names() const {
  std::vector<std::string> names;
  auto collect = [](hid_t, const char* name, const H5O_info_t* info, void* found) -> herr_t {
    if (info->type == H5O_TYPE_DATASET) static_cast<std::vector<std::string>*>(found)->push_back(name);
    return 0;
  };
  check(H5Ovisit2(id(), H5_INDEX_NAME, H5_ITER_INC, collect, &names, H5O_INFO_BASIC),
        file_ + ": cannot list the datasets below " + path_);
  std::sort(names.begin(), names.end());
  return names;
}

void Group::remove(const std::string& name) const {
  validate_name(name, file_);
  check(H5Ldelete(id(), name.c_str(), H5P_DEFAULT), file_ + ": cannot remove " + describe(name));
}

bool Group::has_attribute(const std::string& name) const {
  return check_bool(H5Aexists(id(), name.c_str()),
                    file_ + ": cannot look up attribute " + quoted(name) + " of " + path_);
}

void Group::set_attribute(const std::string& name, const std::string& value) const {
  write_string_attribute(id(), name, value, file_ + ": " + path_);
}

void Group::set_attribute(const std::string& name, int64_t value) const {
  write_int_attribute(id(), name, value, file_ + ": " + path_);
}

std::string Group::string_attribute(const std::string& name) const {
  return read_string_attribute(id(), name, file_ + ": " + path_);
}

int64_t Group::int_attribute(const std::string& name) const {
  return read_int_attribute(id(), name, file_ + ": " + path_);
}

namespace {

Handle open_object(const Group& group, const std::string& object, const std::string& where) {
  validate_name(object, group.file());
  if (!group.contains(object)) throw std::runtime_error(where + " is missing");
  return checked(H5Oopen(group.id(), object.c_str(), H5P_DEFAULT), H5Oclose, where + ": cannot open");
}

}  // namespace

bool Group::object_has_attribute(const std::string& object, const std::string& name) const {
  const std::string where = file_ + ": " + describe(object);
  const Handle opened = open_object(*this, object, where);
  return check_bool(H5Aexists(opened.get(), name.c_str()), where + ": cannot look up attribute " + quoted(name));
}

void Group::set_object_attribute(const std::string& object, const std::string& name, const std::string& value) const {
  const std::string where = file_ + ": " + describe(object);
  write_string_attribute(open_object(*this, object, where).get(), name, value, where);
}

std::string Group::object_string_attribute(const std::string& object, const std::string& name) const {
  const std::string where = file_ + ": " + describe(object);
  return read_string_attribute(open_object(*this, object, where).get(), name, where);
}

void Group::write_string(const std::string& name, const std::string& text) const {
  const std::string where = file_ + ": " + describe(name);
  write_string_dataset(*this, name, {text}, scalar_space(where), where);
}

std::string Group::read_string(const std::string& name) const {
  const std::vector<std::string> texts = read_strings(name);
  if (texts.size() != 1)
    throw std::runtime_error(file_ + ": " + describe(name) + " holds " + std::to_string(texts.size()) +
                             " strings, expected one");
  return texts.front();
}

void Group::write_strings(const std::string& name, const std::vector<std::string>& texts) const {
  const std::string where = file_ + ": " + describe(name);
  write_string_dataset(*this, name, texts, simple_space({texts.size()}, where), where);
}

std::vector<std::string> Group::read_strings(const std::string& name) const {
  validate_name(name, file_);
  const std::string where = file_ + ": " + describe(name);
  if (!contains(name)) throw std::runtime_error(where + " is missing");
  Handle dataset = checked(H5Dopen2(id(), name.c_str(), H5P_DEFAULT), H5Dclose, where + ": cannot open the dataset");
  Handle stored = checked(H5Dget_type(dataset.get()), H5Tclose, where + ": cannot read the dataset type");
  if (H5Tget_class(stored.get()) != H5T_STRING || H5Tis_variable_str(stored.get()) <= 0)
    throw std::runtime_error(where + " is not a variable-length string dataset");
  Handle space = checked(H5Dget_space(dataset.get()), H5Sclose, where + ": cannot read the dataspace");
  const hssize_t count = H5Sget_simple_extent_npoints(space.get());
  if (count < 0) fail(where + ": cannot count the strings");
  Handle type = utf8_string_type(where);
  std::vector<char*> pointers(static_cast<size_t>(count), nullptr);
  if (count > 0)
    check(H5Dread(dataset.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, pointers.data()),
          where + ": cannot read the dataset");
  std::vector<std::string> texts;
  for (const char* text : pointers) texts.emplace_back(text ? text : "");
  if (count > 0) H5Dvlen_reclaim(type.get(), space.get(), H5P_DEFAULT, pointers.data());
  return texts;
}

void Group::write_tensor(const std::string& name, const Tensor& tensor) const {
  validate_name(name, file_);
  const std::string where = file_ + ": tensor " + quoted(name);
  require_host_contiguous(tensor, where);
  if (contains(name)) throw std::runtime_error(where + " already exists");
  Handle type = file_type_of(tensor.dtype);
  Handle space = tensor.shape.empty()
                     ? scalar_space(where)
                     : simple_space(std::vector<hsize_t>(tensor.shape.begin(), tensor.shape.end()), where);
  Handle links = link_creation_with_parents(where);
  Handle creation = untimed_creation(H5P_DATASET_CREATE, where);
  Handle dataset =
      checked(H5Dcreate2(id(), name.c_str(), type.get(), space.get(), links.get(), creation.get(), H5P_DEFAULT), H5Dclose,
              where + ": cannot create the dataset");
  if (tensor.numel() > 0)
    check(H5Dwrite(dataset.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, tensor.data),
          where + ": cannot write the data");
  write_string_attribute(dataset.get(), "dtype", dtype_name(tensor.dtype), where);
  write_shape_attribute(dataset.get(), tensor.shape, where);
}

Group::RawStorage Group::create_raw_tensor(const std::string& name, DType dtype, const std::vector<int64_t>& shape) const {
  validate_name(name, file_);
  const std::string where = file_ + ": tensor " + quoted(name);
  for (int64_t extent : shape)
    if (extent < 0) throw std::invalid_argument(where + ": negative extent in shape " + shape_string(shape));
  if (contains(name)) throw std::runtime_error(where + " already exists");
  Handle type = file_type_of(dtype);
  Handle space = shape.empty() ? scalar_space(where) : simple_space(std::vector<hsize_t>(shape.begin(), shape.end()), where);
  Handle links = link_creation_with_parents(where);
  Handle creation = untimed_creation(H5P_DATASET_CREATE, where);
  check(H5Pset_layout(creation.get(), H5D_CONTIGUOUS), where + ": cannot ask for a contiguous layout");
  // Early: the storage exists (and has its offset) before any H5Dwrite; never filled, so
  // HDF5 writes nothing into it and the caller's bytes are the only ones there.
  check(H5Pset_alloc_time(creation.get(), H5D_ALLOC_TIME_EARLY), where + ": cannot ask for early allocation");
  check(H5Pset_fill_time(creation.get(), H5D_FILL_TIME_NEVER), where + ": cannot switch the fill off");
  Handle dataset = checked(H5Dcreate2(id(), name.c_str(), type.get(), space.get(), links.get(), creation.get(), H5P_DEFAULT),
                           H5Dclose, where + ": cannot create the dataset");
  write_string_attribute(dataset.get(), "dtype", dtype_name(dtype), where);
  write_shape_attribute(dataset.get(), shape, where);
  RawStorage storage;
  const hsize_t bytes = H5Dget_storage_size(dataset.get());
  if (bytes == 0) return storage;
  const haddr_t offset = H5Dget_offset(dataset.get());
  if (offset == HADDR_UNDEF) fail(where + ": the dataset's storage has no file offset");
  storage.offset = offset;
  storage.bytes = bytes;
  return storage;
}

TensorInfo Group::tensor_info(const std::string& name) const { return open_tensor(*this, name).info; }

void Group::read_tensor(const std::string& name, const Tensor& destination) const {
  validate_name(name, file_);
  const std::string where = file_ + ": tensor " + quoted(name);
  require_host_contiguous(destination, where);
  OpenTensor opened = open_tensor(*this, name);
  if (opened.info.dtype != destination.dtype)
    throw std::runtime_error(where + ": dtype " + dtype_name(opened.info.dtype) + " in file, expected " +
                             dtype_name(destination.dtype));
  if (opened.info.shape != destination.shape)
    throw std::runtime_error(where + ": shape " + shape_string(opened.info.shape) + " in file, expected " +
                             shape_string(destination.shape));
  if (destination.numel() > 0)
    check(H5Dread(opened.dataset.get(), opened.type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, destination.data),
          where + ": cannot read the data");
}

// ---- File ----

File File::create(const std::filesystem::path& path, FileAlignment alignment) {
  silence_error_printing();
  const std::string where = path.string();
  Handle access = access_without_locking(where);
  check(H5Pset_alignment(access.get(), alignment.threshold, alignment.alignment),
        where + ": cannot set the alignment of its objects");
  return File(checked(H5Fcreate(where.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, access.get()), H5Fclose,
                      where + ": cannot create HDF5 file"),
              where, "/");
}

File File::open(const std::filesystem::path& path, Access access_mode) {
  silence_error_printing();
  const std::string where = path.string();
  Handle access = access_without_locking(where);
  const unsigned flags = access_mode == Access::ReadOnly ? H5F_ACC_RDONLY : H5F_ACC_RDWR;
  return File(checked(H5Fopen(where.c_str(), flags, access.get()), H5Fclose, where + ": cannot open HDF5 file"), where,
              "/");
}

void File::flush() const { check(H5Fflush(id(), H5F_SCOPE_LOCAL), file_ + ": cannot flush"); }

void File::close() {
  const ssize_t open_objects =
      H5Fget_obj_count(id(), H5F_OBJ_DATASET | H5F_OBJ_GROUP | H5F_OBJ_DATATYPE | H5F_OBJ_ATTR | H5F_OBJ_LOCAL);
  if (open_objects < 0) fail(file_ + ": cannot count open objects");
  if (open_objects > 0)
    throw std::logic_error(file_ + ": closing while " + std::to_string(open_objects) + " objects of it are still open");
  handle_.close(file_ + ": cannot close");
}

}  // namespace tandem::hdf5
