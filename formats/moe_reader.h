// Host side of the GPU layout readers (formats/layout/moe_reader.h): validate a layer's converted
// parameters the way the layout's unpack does (same error codes, naming the parameter) and fill
// a reader whose pointers are wherever the caller keeps the bytes (host memory in the CPU tests,
// device memory in kernels/). A corrupted but well-shaped layout is NOT refused here: the runtime
// computes with it and verify reports the numbers. What is refused is what unpack refuses for
// shape, dtype and index values that would send a reader outside its parameter.
#pragma once

#include <functional>
#include <string>

#include "formats/codec.h"
#include "formats/layout/moe_reader.h"

namespace moepack {

// Where the bytes of a named parameter live (host or device pointer); host_tensor is the tensor
// under that name in `params`.
using ParamLocator =
    std::function<const void*(const std::string& param_name, const Tensor& host_tensor)>;
// Where a canonical QuantTensor buffer lives: host_ptr is its host address, bytes its size.
using BufferLocator = std::function<const void*(const void* host_ptr, size_t bytes)>;

// The reader of one projection of a layer's parameters in `layout` (every expert `params` holds:
// a whole layer or a chunk sliced along the leading expert dimension). Throws what the layout's
// unpack throws for the same parameters (kMissingTensor / kBadShape / kBadDtype / kBadValue /
// kUnsupported), and kUnsupported for a layout with no reader.
reader::ProjReader make_layout_reader(const TargetLayout& layout, const LayoutOptions& lo,
                                      const TensorMap& params, MoeProj proj,
                                      const ParamLocator& locate);

// The reader of a canonical QuantTensor: weight(r, e, n, k) == dequantize_expert(q, e)[n*K + k]
// exactly. Throws kInternal when q's buffers disagree with its shape (check_consistent).
reader::ProjReader make_canonical_reader(const QuantTensor& q, reader::ActQuant act,
                                         const BufferLocator& locate);

// What the serving kernel of this layout does to its activations (the table in
// formats/layout/moe_reader.h).
reader::ActQuant act_quant_of(const TargetLayout& layout, const LayoutOptions& lo);

// The reader kind of a layout (kUnsupported for a layout without one).
reader::Kind reader_kind_of(const TargetLayout& layout);

// Locators for readers over host memory (CPU tests, CPU fallbacks).
const void* host_param(const std::string& param_name, const Tensor& host_tensor);
const void* host_buffer(const void* host_ptr, size_t bytes);

}  // namespace moepack
