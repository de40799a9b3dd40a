// Host side of the layout readers (formats/layout/moe_reader.h): the generic parts every layout's
// builder shares, the canonical reader, and the one CPU expert matmul over any reader.
//
// A target layout's reader is built by its row (TargetLayout::make_reader, in the layout's own
// file next to its *_read_layer): it validates a chunk's parameters the way the layout's unpack
// does (same error codes, naming the parameter) and fills the reader with pointers to wherever
// the caller keeps the bytes (ParamLocator: host memory on the CPU, device memory in kernels/).
// A corrupted but well-shaped layout is NOT refused: the matmul computes with it and verify
// reports the numbers. What is refused is what unpack refuses for shape, dtype and index values
// that would send a reader outside its parameter.
#pragma once

#include <functional>
#include <string>

#include "formats/codec.h"
#include "formats/layout/moe_reader.h"

namespace moepack {

// Where a canonical QuantTensor buffer lives: host_ptr is its host address, bytes its size.
using BufferLocator = std::function<const void*(const void* host_ptr, size_t bytes)>;

// Locators for readers over host memory (the CPU matmul, the CPU tests).
const void* host_param(const std::string& param_name, const Tensor& host_tensor);
const void* host_buffer(const void* host_ptr, size_t bytes);

// Where a canonical QuantTensor's codes live packed two per byte (pack_code_nibbles): codes is
// the host's one-code-per-byte array of `count` codes; the locator returns where the packed
// ((count + 1) / 2 bytes) are.
using NibbleLocator = std::function<const void*(const uint8_t* codes, size_t count)>;

// out[i / 2] holds codes[i] in its low nibble for even i, its high nibble for odd i (the last
// high nibble 0 for an odd count): what the canonical reader reads with packed_codes. Codes of
// <= 4 bits only: kind kInt codes must be -8..7 (sign-extended bytes), others 0..15; anything
// else is kInternal (a code that would not survive packing).
void pack_code_nibbles(const uint8_t* codes, size_t count, bool signed_codes, uint8_t* out);
// The definition, a code at a time; pack_code_nibbles (eight codes a step) equals it byte for
// byte and throws where it throws (after writing every byte of out).
void pack_code_nibbles_scalar(const uint8_t* codes, size_t count, bool signed_codes, uint8_t* out);

// The reader of a canonical QuantTensor: weight(r, e, n, k) == dequantize_expert(q, e)[n*K + k]
// exactly. Throws kInternal when q's buffers disagree with its shape (check_consistent). With
// `pack` and codes of <= 4 bits, the codes are located packed two per byte (half the bytes to
// copy to a device).
// With `codes_at`: q holds no codes (unpack_marlin_moe_without_codes; q.codes empty, else
// kInternal)
// and they are at codes_at already, in the form the reader reads them (two per byte, as
// pack_code_nibbles packs them, for codes of <= 4 bits; one per byte otherwise).
reader::ProjReader make_canonical_reader(const QuantTensor& q, reader::ActQuant act,
                                         const BufferLocator& locate,
                                         const NibbleLocator& pack = {},
                                         const uint8_t* codes_at = nullptr);

// The canonical reader of q as the reference beside a layout's reader: it quantises activations
// exactly as `layout` does (its ActQuant and, for kNvfp4Block16, its activation global scale),
// so the device's two MoEs differ by their weights alone.
reader::ProjReader make_reference_reader(const reader::ProjReader& layout, const QuantTensor& q,
                                         const BufferLocator& locate,
                                         const NibbleLocator& pack = {},
                                         const uint8_t* codes_at = nullptr);

// y[m, r.n] = x[m, r.k] . W_e^T for expert `expert` of the chunk the reader covers: each output
// row's weights decoded once by reader::weight_row and multiplied with every activation row,
// activation columns gathered by reader::act_col, float accumulation in column order. Single
// threaded (callers run experts in parallel). Throws kBadValue for an expert outside the chunk.
// Memory: x and y are read and written only within [0, m * r.k) and [0, m * r.n).
void reader_expert_matmul(const reader::ProjReader& r, int64_t expert, const float* x, int64_t m,
                          float* y);

// ---- for the layouts' builders
// -------------------------------------------------------------------

// A zeroed reader of this kind and activation quantisation.
reader::ProjReader blank_reader(reader::Kind kind, reader::ActQuant act);
// The located address of parameter `name` of `params` (kMissingTensor naming it when absent;
// kInternal when the locator returns null for a non-empty tensor).
const void* locate_param(const ParamLocator& locate, const TensorMap& params,
                         const std::string& name);
// The reader's ScaleType of a scale dtype (kBadDtype naming `what` for one no reader reads).
int32_t reader_scale_type(DType d, const std::string& what);
// 16-bit activations in the layout's activation dtype (Marlin, Triton WNA16).
reader::ActQuant act_quant_16bit(const LayoutOptions& lo);

}  // namespace moepack
