//! Just enough of a BTF reader to find where `struct sock_common` keeps
//! the fields the start-up walk reads, in the running kernel
//! (`/sys/kernel/btf/vmlinux`). Layouts differ between kernel builds; BTF
//! says what this one uses, so no offsets are compiled in.

use std::{collections::HashMap, io};

use limiter_common::SockOffsets;

/// Where the running kernel's BTF is.
const VMLINUX: &str = "/sys/kernel/btf/vmlinux";

/// Why the walk's offsets could not be read from the kernel's BTF.
#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    #[error("reading {path}: {source} (limiter needs a kernel with BTF)")]
    Read { path: &'static str, source: io::Error },
    #[error("{path}: {source}")]
    Malformed { path: &'static str, source: MalformedBtf },
    #[error("the kernel's BTF has no struct {0}")]
    NoStruct(String),
    #[error("struct {strukt} has no {field} in this kernel")]
    NoField { strukt: &'static str, field: &'static str },
}

/// What is wrong with bytes that should be BTF.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum MalformedBtf {
    #[error("not BTF (bad magic)")]
    BadMagic,
    #[error("truncated or malformed BTF")]
    Truncated,
    #[error("unknown BTF kind {0}")]
    UnknownKind(u32),
}

const MAGIC: u16 = 0xeb9f;
const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_FWD: u32 = 7;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC: u32 = 12;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_FLOAT: u32 = 16;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;

#[derive(Clone, Debug)]
struct Member {
    name: u32,
    ty: u32,
    bit_offset: u32,
}

#[derive(Clone, Debug)]
struct Type {
    kind: u32,
    name: u32,
    /// Referenced type (typedefs, modifiers).
    ty: u32,
    members: Vec<Member>,
}

/// Parsed type information.
#[derive(Debug)]
pub struct Btf {
    types: Vec<Type>,
    strings: Vec<u8>,
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

impl Btf {
    /// Parses raw BTF (little-endian, as the kernel exposes it here).
    pub fn parse(data: &[u8]) -> Result<Self, MalformedBtf> {
        let bad = || MalformedBtf::Truncated;
        if u16_at(data, 0) != Some(MAGIC) {
            return Err(MalformedBtf::BadMagic);
        }
        let hdr_len = u32_at(data, 4).ok_or_else(bad)? as usize;
        let type_off = u32_at(data, 8).ok_or_else(bad)? as usize;
        let type_len = u32_at(data, 12).ok_or_else(bad)? as usize;
        let str_off = u32_at(data, 16).ok_or_else(bad)? as usize;
        let str_len = u32_at(data, 20).ok_or_else(bad)? as usize;
        let types_raw = data.get(hdr_len + type_off..hdr_len + type_off + type_len).ok_or_else(bad)?;
        let strings = data.get(hdr_len + str_off..hdr_len + str_off + str_len).ok_or_else(bad)?.to_vec();
        // Type id 0 is void.
        let mut types = vec![Type { kind: 0, name: 0, ty: 0, members: Vec::new() }];
        let mut at = 0;
        while at < types_raw.len() {
            let name = u32_at(types_raw, at).ok_or_else(bad)?;
            let info = u32_at(types_raw, at + 4).ok_or_else(bad)?;
            let size_or_type = u32_at(types_raw, at + 8).ok_or_else(bad)?;
            at += 12;
            let kind = (info >> 24) & 0x1f;
            let vlen = (info & 0xffff) as usize;
            let kind_flag = info >> 31 == 1;
            let mut members = Vec::new();
            match kind {
                KIND_INT | KIND_VAR | KIND_DECL_TAG => at += 4,
                KIND_ARRAY => at += 12,
                KIND_STRUCT | KIND_UNION => {
                    for _ in 0..vlen {
                        let offset = u32_at(types_raw, at + 8).ok_or_else(bad)?;
                        members.push(Member {
                            name: u32_at(types_raw, at).ok_or_else(bad)?,
                            ty: u32_at(types_raw, at + 4).ok_or_else(bad)?,
                            bit_offset: if kind_flag { offset & 0x00ff_ffff } else { offset },
                        });
                        at += 12;
                    }
                }
                KIND_ENUM | KIND_FUNC_PROTO => at += 8 * vlen,
                KIND_DATASEC | KIND_ENUM64 => at += 12 * vlen,
                KIND_PTR | KIND_FWD | KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT
                | KIND_FUNC | KIND_FLOAT | KIND_TYPE_TAG => {}
                other => return Err(MalformedBtf::UnknownKind(other)),
            }
            types.push(Type { kind, name, ty: size_or_type, members });
        }
        Ok(Self { types, strings })
    }

    fn name(&self, off: u32) -> &str {
        let rest = self.strings.get(off as usize..).unwrap_or_default();
        let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        std::str::from_utf8(&rest[..end]).unwrap_or("")
    }

    /// Byte offsets of every named member of struct `name`, looking through
    /// anonymous structs and unions.
    pub fn member_offsets(&self, name: &str) -> Result<HashMap<String, u32>, BtfError> {
        let id = self
            .types
            .iter()
            .position(|t| t.kind == KIND_STRUCT && self.name(t.name) == name)
            .ok_or_else(|| BtfError::NoStruct(name.to_owned()))?;
        let mut out = HashMap::new();
        self.collect(id, 0, &mut out, 0);
        Ok(out)
    }

    fn collect(&self, id: usize, base_bits: u32, out: &mut HashMap<String, u32>, depth: u32) {
        let Some(t) = self.types.get(id) else { return };
        if depth > 8 {
            return;
        }
        for m in &t.members {
            let bits = base_bits + m.bit_offset;
            let member_name = self.name(m.name);
            if member_name.is_empty() {
                let inner = self.resolve(m.ty as usize);
                self.collect(inner, bits, out, depth + 1);
            } else {
                out.entry(member_name.to_owned()).or_insert(bits / 8);
            }
        }
    }

    /// Follows typedefs and modifiers.
    fn resolve(&self, mut id: usize) -> usize {
        for _ in 0..16 {
            match self.types.get(id) {
                Some(t)
                    if matches!(
                        t.kind,
                        KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG
                    ) =>
                {
                    id = t.ty as usize;
                }
                _ => break,
            }
        }
        id
    }
}

/// The offsets the walk needs, from the running kernel's BTF.
pub fn sock_offsets() -> Result<SockOffsets, BtfError> {
    let path = VMLINUX;
    let data = std::fs::read(path).map_err(|source| BtfError::Read { path, source })?;
    offsets_from(&Btf::parse(&data).map_err(|source| BtfError::Malformed { path, source })?)
}

fn offsets_from(btf: &Btf) -> Result<SockOffsets, BtfError> {
    let field = |strukt: &'static str, field: &'static str| -> Result<u32, BtfError> {
        btf.member_offsets(strukt)?.get(field).copied().ok_or(BtfError::NoField { strukt, field })
    };
    Ok(SockOffsets {
        daddr: field("sock_common", "skc_daddr")?,
        v6_daddr: field("sock_common", "skc_v6_daddr")?,
        num: field("sock_common", "skc_num")?,
        family: field("sock_common", "skc_family")?,
        state: field("sock_common", "skc_state")?,
        sk_cgroup: field("sock", "sk_cgrp_data")? + field("sock_cgroup_data", "cgroup")?,
        cgroup_kn: field("cgroup", "kn")?,
        kn_id: field("kernfs_node", "id")?,
        cgroup_self: field("cgroup", "self")?,
        css_parent: field("cgroup_subsys_state", "parent")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn running_kernel_offsets_match_the_stable_prefix_of_sock_common() {
        // skc_daddr, skc_num, skc_family and skc_state have sat at these
        // offsets since the struct was introduced; finding them proves the
        // reader walks anonymous unions correctly.
        let Ok(data) = std::fs::read(VMLINUX) else {
            panic!("this machine has no /sys/kernel/btf/vmlinux; limiter's kernel gate needs BTF");
        };
        let off = offsets_from(&Btf::parse(&data).unwrap()).unwrap();
        assert_eq!((off.daddr, off.num, off.family, off.state), (0, 14, 16, 18));
        assert!(off.v6_daddr >= 24 && off.v6_daddr.is_multiple_of(4), "{off:?}");
        assert!(off.sk_cgroup > off.v6_daddr && off.sk_cgroup.is_multiple_of(8), "{off:?}");
        assert!(off.kn_id.is_multiple_of(8) && off.cgroup_kn.is_multiple_of(8), "{off:?}");
    }

    #[test]
    fn garbage_is_refused_with_a_reason() {
        assert_eq!(Btf::parse(b"nope").unwrap_err(), MalformedBtf::BadMagic);
        let mut header = vec![0x9f, 0xeb, 1, 0, 24, 0, 0, 0];
        header.extend_from_slice(&[0, 0, 0, 0, 100, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        let e = BtfError::Malformed { path: VMLINUX, source: Btf::parse(&header).unwrap_err() };
        assert_eq!(e.to_string(), "/sys/kernel/btf/vmlinux: truncated or malformed BTF");
        let missing = Btf::parse(&real_btf()).unwrap().member_offsets("no_such_struct").unwrap_err();
        assert_eq!(missing.to_string(), "the kernel's BTF has no struct no_such_struct");
    }

    fn real_btf() -> Vec<u8> {
        std::fs::read(VMLINUX).expect("this machine has /sys/kernel/btf/vmlinux")
    }
}
