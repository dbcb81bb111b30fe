//! The claim script, run as Redis runs it: Lua 5.1 (the version Redis
//! embeds), `KEYS` and `ARGV` as globals, `redis.call` and `redis.pcall`
//! against the simulated [`Store`], replies converted both ways by
//! Redis' rules (a Lua number becomes an integer, truncated; `false`
//! nil; a table an array up to its first nil), globals refused as
//! Redis 7 refuses them. Nothing of the script is restated here: the
//! file the daemon loads is the file that runs.

use std::cell::RefCell;

use mlua::{Function, Lua, Value, Variadic};

use crate::store::{Reply, Store};

/// A script, compiled once, run against a store.
pub struct Script {
    lua: Lua,
    body: Function,
}

impl Script {
    pub fn new(name: &str, source: &str) -> anyhow::Result<Self> {
        let lua = Lua::new();
        let body = lua.load(source).set_name(name).into_function().map_err(|e| anyhow::anyhow!("{e}"))?;
        // Redis 7: a script that would create a global is an error.
        lua.load(
            "setmetatable(_G, { __newindex = function(_, k) error('Script attempted to create global variable ' .. tostring(k), 2) end })",
        )
        .exec()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok(Self { lua, body })
    }

    /// `EVAL script numkeys KEYS… ARGV…` at `now_us`.
    pub fn eval(&self, store: &mut Store, now_us: u64, keys: &[String], argv: &[String]) -> Reply {
        let store = RefCell::new(store);
        let result = self.lua.scope(|scope| {
            let globals = self.lua.globals();
            globals.raw_set("KEYS", self.lua.create_sequence_from(keys.iter().map(String::as_str))?)?;
            globals.raw_set("ARGV", self.lua.create_sequence_from(argv.iter().map(String::as_str))?)?;
            let redis = self.lua.create_table()?;
            let call = |raise: bool| {
                let store = &store;
                move |lua: &Lua, args: Variadic<Value>| -> mlua::Result<Value> {
                    let args = args.iter().map(arg).collect::<mlua::Result<Vec<String>>>()?;
                    let reply = store.borrow_mut().command(now_us, &args);
                    match reply {
                        Reply::Error(e) if raise => Err(mlua::Error::RuntimeError(e)),
                        r => to_lua(lua, r),
                    }
                }
            };
            redis.raw_set("call", scope.create_function(call(true))?)?;
            redis.raw_set("pcall", scope.create_function(call(false))?)?;
            redis.raw_set(
                "error_reply",
                scope.create_function(|lua, e: String| {
                    let t = lua.create_table()?;
                    t.raw_set("err", e)?;
                    Ok(t)
                })?,
            )?;
            redis.raw_set(
                "status_reply",
                scope.create_function(|lua, s: String| {
                    let t = lua.create_table()?;
                    t.raw_set("ok", s)?;
                    Ok(t)
                })?,
            )?;
            globals.raw_set("redis", redis)?;
            let out: Value = self.body.call(())?;
            Ok(from_lua(&out))
        });
        result.unwrap_or_else(|e| Reply::Error(format!("ERR Error running script: {e}")))
    }
}

/// An argument of `redis.call`: a string as it is, a number as Redis
/// prints it (`%.17g`).
fn arg(v: &Value) -> mlua::Result<String> {
    match v {
        Value::String(s) => Ok(s.to_str()?.to_owned()),
        Value::Integer(n) => Ok(n.to_string()),
        Value::Number(n) if n.fract() == 0.0 && n.abs() < 1e17 => Ok((*n as i64).to_string()),
        Value::Number(n) => Ok(format!("{n}")),
        other => Err(mlua::Error::RuntimeError(format!(
            "Lua redis lib command arguments must be strings or integers, not {}",
            other.type_name()
        ))),
    }
}

/// A reply as the script sees it.
fn to_lua(lua: &Lua, r: Reply) -> mlua::Result<Value> {
    Ok(match r {
        Reply::Nil => Value::Boolean(false),
        Reply::Int(n) => Value::Number(n as f64),
        Reply::Bulk(s) => Value::String(lua.create_string(&s)?),
        Reply::Status(s) => {
            let t = lua.create_table()?;
            t.raw_set("ok", s)?;
            Value::Table(t)
        }
        Reply::Error(e) => {
            let t = lua.create_table()?;
            t.raw_set("err", e)?;
            Value::Table(t)
        }
        Reply::Array(items) => {
            let t = lua.create_table()?;
            for (i, item) in items.into_iter().enumerate() {
                t.raw_set(i + 1, to_lua(lua, item)?)?;
            }
            Value::Table(t)
        }
    })
}

/// What the script returned, as the client receives it.
fn from_lua(v: &Value) -> Reply {
    match v {
        Value::Nil | Value::Boolean(false) => Reply::Nil,
        Value::Boolean(true) => Reply::Int(1),
        Value::Integer(n) => Reply::Int(*n),
        Value::Number(n) => Reply::Int(n.trunc() as i64),
        Value::String(s) => Reply::Bulk(s.to_string_lossy().to_string()),
        Value::Table(t) => {
            if let Ok(Value::String(e)) = t.raw_get::<Value>("err") {
                return Reply::Error(e.to_string_lossy().to_string());
            }
            if let Ok(Value::String(s)) = t.raw_get::<Value>("ok") {
                return Reply::Status(s.to_string_lossy().to_string());
            }
            let mut items = Vec::new();
            for i in 1.. {
                match t.raw_get::<Value>(i) {
                    Ok(Value::Nil) | Err(_) => break,
                    Ok(v) => items.push(from_lua(&v)),
                }
            }
            Reply::Array(items)
        }
        _ => Reply::Nil,
    }
}
