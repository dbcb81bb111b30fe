//! Value parsers of the key table: each takes the text after `=` and
//! returns the typed value or a message saying what is wrong with it (the
//! caller adds file, line and key).

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::{Path, PathBuf},
};

use super::{AccessLog, Prefix, Secret, Upstream, XdpModeChoice, mask_addr};

pub(super) fn int_at_least(value: &str, min: u32) -> Result<u32, String> {
    let n: i64 = value.parse().map_err(|_| format!("not a whole number (expected at least {min})"))?;
    if n < i64::from(min) {
        return Err(format!("must be at least {min}"));
    }
    u32::try_from(n).map_err(|_| format!("must be at most {}", u32::MAX))
}

pub(super) fn ms(value: &str, min: u32) -> Result<u64, String> {
    int_at_least(value, min).map(u64::from)
}

pub(super) fn ratio(value: &str) -> Result<f64, String> {
    let x: f64 = value.parse().map_err(|_| "not a number (expected a ratio such as 0.5)".to_owned())?;
    if !(x > 0.0 && x < 1.0) {
        return Err("must be above 0 and below 1".into());
    }
    Ok(x)
}

pub(super) fn boolean(value: &str) -> Result<bool, String> {
    match value {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err("expected `true` or `false`".into()),
    }
}

pub(super) fn absolute_path(value: &str) -> Result<PathBuf, String> {
    let path = PathBuf::from(value);
    if value.is_empty() || !path.is_absolute() {
        return Err("must be an absolute path".into());
    }
    Ok(path)
}

pub(super) fn socket_addr(value: &str) -> Result<SocketAddr, String> {
    value.parse().map_err(|_| "expected an address and port such as 127.0.0.1:9901 or [::1]:9901".into())
}

/// `host:port`, `http://host:port`, or `sample` (the built-in sample
/// upstream, for demos).
pub(super) fn upstream(value: &str) -> Result<Upstream, String> {
    if value == "sample" {
        return Ok(Upstream::Sample);
    }
    let rest = value.strip_prefix("http://").unwrap_or(value);
    let rest = rest.trim_end_matches('/');
    if rest.starts_with("https://") || value.starts_with("https://") {
        return Err("TLS to the upstream is not supported; give host:port of a plain HTTP upstream".into());
    }
    let Some((host, port)) = rest.rsplit_once(':') else {
        return Err("expected host:port (or http://host:port, or `sample`)".into());
    };
    if host.is_empty() || host.contains('/') || port.parse::<u16>().map_or(true, |p| p == 0) {
        return Err("expected host:port (or http://host:port, or `sample`)".into());
    }
    Ok(Upstream::At(rest.to_owned()))
}

/// `http.accessLog`: `off`, `stderr` or an absolute path in a directory
/// that exists (the file is created, or appended to).
pub(super) fn access_log(value: &str) -> Result<AccessLog, String> {
    match value {
        "off" => Ok(AccessLog::Off),
        "stderr" => Ok(AccessLog::Stderr),
        _ => {
            let path =
                absolute_path(value).map_err(|_| "expected off, stderr or an absolute path".to_owned())?;
            if path.is_dir() {
                return Err(format!("{} is a directory", path.display()));
            }
            match path.parent() {
                Some(dir) if dir.is_dir() => Ok(AccessLog::File(path)),
                _ => Err(format!("the directory of {} does not exist", path.display())),
            }
        }
    }
}

/// `kernel.xdp.mode`.
pub(super) fn xdp_mode(value: &str) -> Result<XdpModeChoice, String> {
    match value {
        "auto" => Ok(XdpModeChoice::Auto),
        "driver" => Ok(XdpModeChoice::Driver),
        "generic" => Ok(XdpModeChoice::Generic),
        _ => Err("expected auto, driver or generic".into()),
    }
}

/// `KEY = /path`: a secret file's absolute path and its secret (see
/// [`read_secret`]).
pub(super) fn secret_file(value: &str, min: usize, what: &str) -> Result<(PathBuf, Secret), String> {
    let path = absolute_path(value)?;
    let secret = Secret(read_secret(&path, min, what)?);
    Ok((path, secret))
}

fn read_secret(path: &Path, min: usize, what: &str) -> Result<String, String> {
    use std::{io::Read as _, os::unix::fs::MetadataExt as _};
    let mut file = crate::dir_trust::open_trusted(path)?;
    // A secret every local user can read is no secret: refuse it, as ssh
    // refuses a private key others can read. (The mode of what was opened,
    // not of what the path names a moment later.)
    let meta = file.metadata().map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if meta.mode() & 0o007 != 0 {
        return Err(format!(
            "{} (owner uid {}, group {}, mode {:04o}): other users can read it; make it readable by the \
             daemon's user or group only (chmod 0600, or 0640 with the daemon's own group)",
            path.display(),
            meta.uid(),
            meta.gid(),
            meta.mode() & 0o7777
        ));
    }
    let mut text = String::new();
    file.read_to_string(&mut text).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let token = text.lines().next().unwrap_or("").trim();
    if token.len() < min || token.contains(char::is_whitespace) {
        return Err(format!(
            "{}: {what} must be one line of at least {min} characters without spaces",
            path.display()
        ));
    }
    Ok(token.to_owned())
}

/// A tracing filter directive, checked the way the logger will parse it.
pub(super) fn log_level(value: &str) -> Result<String, String> {
    tracing_subscriber::EnvFilter::builder()
        .parse(value)
        .map(|_| value.to_owned())
        .map_err(|e| format!("not a log filter ({e}); try error, warn, info, debug or trace"))
}

pub(super) fn int_in(value: &str, min: u32, max: u32) -> Result<u32, String> {
    match value.parse::<i64>() {
        Ok(n) if (i64::from(min)..=i64::from(max)).contains(&n) => Ok(n as u32),
        Ok(_) => Err(format!("must be between {min} and {max}")),
        Err(_) => Err("not a whole number".into()),
    }
}

/// A power of two from `min` to `max` (the size of a kernel table).
pub(super) fn power_of_two_in(value: &str, min: u32, max: u32) -> Result<u32, String> {
    let n = int_in(value, min, max)?;
    if !n.is_power_of_two() {
        return Err(format!("{n} is not a power of two (such as {})", min * 16));
    }
    Ok(n)
}

/// `on` or `off`.
pub(super) fn on_off(value: &str) -> Result<bool, String> {
    match value {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(format!("`{value}` is neither `on` nor `off`")),
    }
}

/// `/api/pay/, /health` (comma-separated): prefixes of normalised paths,
/// as [`crate::proxy::path::normalised`] writes them: from `/`, without a
/// query, escapes, parameters, dot-segments, empty segments or
/// backslashes (a prefix holding one could never match).
pub(super) fn path_prefixes(value: &str) -> Result<Vec<String>, String> {
    let mut out: Vec<String> = Vec::new();
    for item in value.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        if !item.starts_with('/') {
            return Err(format!("`{item}` does not start with `/`"));
        }
        if let Some(c) = item
            .chars()
            .find(|c| matches!(c, '?' | '#' | '%' | ';' | '\\') || c.is_whitespace() || c.is_control())
        {
            return Err(format!(
                "`{item}` holds `{}`, which a normalised path never does",
                c.escape_default()
            ));
        }
        let segments: Vec<&str> = item[1..].split('/').collect();
        let last = segments.len() - 1;
        if segments.iter().enumerate().any(|(i, s)| matches!(*s, "." | "..") || (s.is_empty() && i != last)) {
            return Err(format!(
                "`{item}` has an empty, `.` or `..` segment, which a normalised path never does"
            ));
        }
        if out.iter().any(|o| o == item) {
            return Err(format!("`{item}` is listed twice"));
        }
        out.push(item.to_owned());
    }
    Ok(out)
}

/// `10.0.0.0/8, fd00::/8, 192.0.2.7` (no length: the whole address).
pub(super) fn prefixes(value: &str) -> Result<Vec<Prefix>, String> {
    let mut out = Vec::new();
    for item in value.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (addr, len) = item.split_once('/').unwrap_or((item, ""));
        let addr: std::net::IpAddr =
            addr.trim().parse().map_err(|_| format!("`{item}`: `{addr}` is not an IPv4 or IPv6 address"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let len = if len.is_empty() {
            max
        } else {
            match len.trim().parse::<u8>() {
                Ok(l) if l <= max => l,
                _ => return Err(format!("`{item}`: prefix length must be 0-{max}")),
            }
        };
        let prefix = Prefix { addr: mask_addr(addr, len), len };
        if prefix.addr != addr {
            return Err(format!("`{item}` has host bits set; did you mean {prefix}?"));
        }
        // ::ffff:a.b.c.d/len is the IPv4 prefix a.b.c.d/(len-96): one form.
        let prefix = match prefix.addr {
            std::net::IpAddr::V6(v6) if len >= 96 => match v6.to_ipv4_mapped() {
                Some(v4) => Prefix { addr: v4.into(), len: len - 96 },
                None => prefix,
            },
            _ => prefix,
        };
        if out.contains(&prefix) {
            return Err(format!("{prefix} is listed twice"));
        }
        out.push(prefix);
    }
    Ok(out)
}

/// `eth0, eth1`
pub(super) fn interfaces(value: &str) -> Result<Vec<String>, String> {
    let mut out: Vec<String> = Vec::new();
    for item in value.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        if item.len() > 15 || item.contains(['/', ' ']) || item == "." || item == ".." {
            return Err(format!("`{item}` is not an interface name (at most 15 characters, no `/`)"));
        }
        if out.iter().any(|i| i == item) {
            return Err(format!("interface {item} is listed twice"));
        }
        out.push(item.to_owned());
    }
    Ok(out)
}

/// `8080:400, 8443:200`
pub(super) fn parse_ports(value: &str) -> Result<BTreeMap<u16, u32>, String> {
    let mut ports = BTreeMap::new();
    for item in value.split(',').map(str::trim) {
        if item.is_empty() {
            if value.trim().is_empty() {
                break;
            }
            return Err("empty item in the list (expected port:max, port:max, ...)".into());
        }
        let Some((port, max)) = item.split_once(':') else {
            return Err(format!("`{item}`: expected port:max, such as 8080:400"));
        };
        let port: i64 = port.trim().parse().map_err(|_| format!("`{item}`: the port is not a number"))?;
        if !(1..=65535).contains(&port) {
            return Err(format!("`{item}`: port {port} is outside 1-65535"));
        }
        let max: i64 =
            max.trim().parse().map_err(|_| format!("`{item}`: the limit is not a whole number"))?;
        if max < 1 {
            return Err(format!("`{item}`: the limit must be at least 1"));
        }
        let max = u32::try_from(max).map_err(|_| format!("`{item}`: the limit is too large"))?;
        let port = port as u16;
        if ports.insert(port, max).is_some() {
            return Err(format!("port {port} is listed twice"));
        }
    }
    Ok(ports)
}

/// `500-599, 429`
pub(super) fn statuses(value: &str) -> Result<Vec<(u16, u16)>, String> {
    let mut out = Vec::new();
    for item in value.split(',').map(str::trim) {
        let (lo, hi) = item.split_once('-').unwrap_or((item, item));
        let parse = |s: &str| -> Result<u16, String> {
            let n: u16 = s.trim().parse().map_err(|_| format!("`{item}`: not a status code"))?;
            if !(100..=599).contains(&n) {
                return Err(format!("`{item}`: statuses are 100-599"));
            }
            Ok(n)
        };
        let (lo, hi) = (parse(lo)?, parse(hi)?);
        if lo > hi {
            return Err(format!("`{item}`: the range is backwards"));
        }
        out.push((lo, hi));
    }
    Ok(out)
}
