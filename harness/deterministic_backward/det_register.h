// Registration of a harness extension's kernels into aten for the CUDA dispatch key, shared by
// the det_ops*.cpp files.  It makes the same torch::Library object that
// TORCH_LIBRARY_IMPL(aten, CUDA, m) makes at load time, but on request (register_aten_cuda()),
// so that one process can first measure torch's own kernels and then ours.  A kernel the
// dispatcher refuses is reported, not thrown: the caller gets every refusal at once.
#pragma once

#include <torch/library.h>

#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

class DetbwRegistrar {
 public:
  DetbwRegistrar(torch::Library& lib, std::vector<std::string>& errors) : lib_(lib), errors_(errors) {}

  // name: the aten schema name ("op" or "op.overload"); fn: TORCH_FN(kernel)
  template <class Kernel>
  void impl(const char* name, Kernel&& fn) {
    try {
      lib_.impl(name, std::forward<Kernel>(fn));
    } catch (const std::exception& e) {
      errors_.push_back(std::string(name) + ": " + e.what());
    }
  }

 private:
  torch::Library& lib_;
  std::vector<std::string>& errors_;
};

// Registers once per library slot (a second call does nothing); returns the refusals (empty: all).
// lib: the extension's own static slot, which keeps the registration alive for the process.
inline std::vector<std::string> detbw_register_aten_cuda(std::unique_ptr<torch::Library>& lib, const char* file,
                                                         uint32_t line,
                                                         const std::function<void(DetbwRegistrar&)>& add) {
  std::vector<std::string> errors;
  if (lib) return errors;
  lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", std::make_optional(c10::DispatchKey::CUDA),
                                         file, line);
  DetbwRegistrar registrar(*lib, errors);
  add(registrar);
  return errors;
}
