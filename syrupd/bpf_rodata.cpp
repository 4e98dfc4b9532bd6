#include "bpf_rodata.h"

#include <bpf/btf.h>

#include <cerrno>
#include <cstring>
#include <string_view>

namespace syrup {

int set_rodata(bpf_object* obj, const std::string& name, uint64_t value) {
  bpf_map* rodata = nullptr;
  bpf_map* m;
  bpf_object__for_each_map(m, obj) {
    const char* n = bpf_map__name(m);
    std::string_view sv(n);
    if (bpf_map__is_internal(m) && sv.ends_with(".rodata")) rodata = m;
  }
  const btf* b = bpf_object__btf(obj);
  if (!rodata || !b) return -ENOENT;
  size_t size = 0;
  auto* data = static_cast<char*>(bpf_map__initial_value(rodata, &size));
  int sec_id = btf__find_by_name_kind(b, ".rodata", BTF_KIND_DATASEC);
  if (!data || sec_id < 0) return -ENOENT;
  const btf_type* sec = btf__type_by_id(b, sec_id);
  const btf_var_secinfo* vs = btf_var_secinfos(sec);
  for (unsigned i = 0; i < btf_vlen(sec); i++, vs++) {
    const btf_type* var = btf__type_by_id(b, vs->type);
    if (name != btf__name_by_offset(b, var->name_off)) continue;
    const btf_type* t = btf__type_by_id(b, btf__resolve_type(b, var->type));
    if (!t || !(btf_is_int(t) || btf_is_enum(t)) || vs->offset + vs->size > size) return -EINVAL;
    if (vs->size < 8 && (value >> (vs->size * 8)) != 0) return -ERANGE;
    switch (vs->size) {
      case 1: { uint8_t v = static_cast<uint8_t>(value); std::memcpy(data + vs->offset, &v, 1); break; }
      case 2: { uint16_t v = static_cast<uint16_t>(value); std::memcpy(data + vs->offset, &v, 2); break; }
      case 4: { uint32_t v = static_cast<uint32_t>(value); std::memcpy(data + vs->offset, &v, 4); break; }
      case 8: std::memcpy(data + vs->offset, &value, 8); break;
      default: return -EINVAL;
    }
    return 0;
  }
  return -ENOENT;
}

}  // namespace syrup
