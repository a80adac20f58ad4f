// The plugin's configuration (initialize.config), validated and normalized. Errors name the
// key, never its value (a secret may be involved).

import { RpcError } from "./errors.mjs";

export const DEFAULTS = {
  domain: "localhost:8080",
  protocol: "",
  use_server_proxy: false,
  default_image: "python:3.12-slim",
  image_aliases: "",
  entrypoint: "tail -f /dev/null",
  ready_timeout: 90,
  poll_interval: 10,
  network_policy: "",
  platform: "",
  secure_access: false,
};

const bad = (key, why) =>
  new RpcError(8006, `Provider 'opensandbox': invalid configuration: key '${key}' ${why}.`, `Fix it with: abx provider configure opensandbox ${key}=...`);

function text(v) {
  return v == null ? "" : typeof v === "string" ? v.trim() : v;
}

function bool(cfg, key) {
  const v = cfg[key] ?? DEFAULTS[key];
  if (typeof v === "boolean") return v;
  if (typeof v === "string" && /^(1|true|yes|on)$/i.test(v.trim())) return true;
  if (typeof v === "string" && /^(0|false|no|off|)$/i.test(v.trim())) return false;
  throw bad(key, "must be true or false");
}

// A JSON object, or "name=value,name=value".
function table(cfg, key) {
  const v = text(cfg[key] ?? DEFAULTS[key]);
  if (v === "" || v == null) return {};
  if (typeof v === "object" && !Array.isArray(v)) return v;
  if (typeof v !== "string") throw bad(key, "must be a JSON object or name=value pairs");
  if (v.startsWith("{")) {
    try {
      const o = JSON.parse(v);
      if (o && typeof o === "object" && !Array.isArray(o)) return o;
    } catch {
      // fall through
    }
    throw bad(key, "is not a valid JSON object");
  }
  const out = {};
  for (const part of v.split(",")) {
    if (!part.trim()) continue;
    const i = part.indexOf("=");
    if (i <= 0) throw bad(key, "must be a JSON object or name=value pairs separated by commas");
    out[part.slice(0, i).trim()] = part.slice(i + 1).trim();
  }
  return out;
}

// Resolve the lifecycle API's base URL: base_url, else protocol://domain; "/v1" is appended
// unless the path already ends with it.
export function apiBase(cfg) {
  const baseUrl = text(cfg.base_url);
  const protocol = text(cfg.protocol ?? DEFAULTS.protocol);
  let raw;
  if (baseUrl) {
    raw = /^[a-z][a-z0-9+.-]*:\/\//i.test(baseUrl) ? baseUrl : `${protocol || "http"}://${baseUrl}`;
  } else {
    const domain = text(cfg.domain ?? DEFAULTS.domain);
    if (!domain) throw bad("base_url", "has no value and 'domain' is empty");
    raw = /^[a-z][a-z0-9+.-]*:\/\//i.test(domain) ? domain : `${protocol || "http"}://${domain}`;
  }
  let u;
  try {
    u = new URL(raw);
  } catch {
    throw bad(baseUrl ? "base_url" : "domain", "is not a valid URL");
  }
  if (u.protocol !== "http:" && u.protocol !== "https:") throw bad(baseUrl ? "base_url" : "domain", "must use http or https");
  if (u.username || u.password) throw bad("base_url", "must not carry credentials (use api_key)");
  let path = u.pathname.replace(/\/+$/, "");
  if (!/\/v1$/.test(path)) path += "/v1";
  return { api: `${u.protocol}//${u.host}${path}`, scheme: u.protocol.replace(":", "") };
}

export function parseConfig(raw = {}) {
  const cfg = raw ?? {};
  const { api, scheme } = apiBase(cfg);
  const protocol = text(cfg.protocol ?? DEFAULTS.protocol) || scheme;
  if (protocol !== "http" && protocol !== "https") throw bad("protocol", "must be http or https");

  const readyTimeout = cfg.ready_timeout ?? DEFAULTS.ready_timeout;
  if (typeof readyTimeout !== "number" || !(readyTimeout > 0) || readyTimeout > 3600) {
    throw bad("ready_timeout", "must be a number of seconds between 1 and 3600");
  }

  // Seconds between two looks at the server's sandbox list (sandbox/changed for what changed
  // there without the broker); 0 turns the polling off.
  const pollInterval = cfg.poll_interval ?? DEFAULTS.poll_interval;
  if (typeof pollInterval !== "number" || !(pollInterval >= 0) || pollInterval > 86400 || (pollInterval > 0 && pollInterval < 0.05)) {
    throw bad("poll_interval", "must be a number of seconds (at most 86400), or 0 for no polling");
  }

  let entrypoint = text(cfg.entrypoint ?? DEFAULTS.entrypoint);
  if (Array.isArray(entrypoint)) {
    // as given
  } else if (typeof entrypoint === "string" && entrypoint.startsWith("[")) {
    try {
      entrypoint = JSON.parse(entrypoint);
    } catch {
      throw bad("entrypoint", "is not a valid JSON array");
    }
  } else if (typeof entrypoint === "string") {
    entrypoint = entrypoint.split(/\s+/).filter(Boolean);
  }
  if (!Array.isArray(entrypoint) || entrypoint.length === 0 || entrypoint.some((x) => typeof x !== "string")) {
    throw bad("entrypoint", "must be a command (words separated by spaces, or a JSON array of strings)");
  }

  let networkPolicy = text(cfg.network_policy ?? DEFAULTS.network_policy);
  if (networkPolicy === "") networkPolicy = null;
  else if (typeof networkPolicy === "string") {
    try {
      networkPolicy = JSON.parse(networkPolicy);
    } catch {
      throw bad("network_policy", "is not valid JSON (e.g. {\"defaultAction\":\"deny\",\"egress\":[{\"action\":\"allow\",\"target\":\"pypi.org\"}]})");
    }
  }
  if (networkPolicy !== null && (typeof networkPolicy !== "object" || Array.isArray(networkPolicy))) {
    throw bad("network_policy", "must be a JSON object");
  }

  let platform = text(cfg.platform ?? DEFAULTS.platform);
  if (platform === "") platform = null;
  else if (typeof platform === "string") {
    if (platform.startsWith("{")) {
      try {
        platform = JSON.parse(platform);
      } catch {
        throw bad("platform", "is not valid JSON");
      }
    } else {
      const m = /^([a-z0-9]+)\/([a-z0-9_]+)$/i.exec(platform);
      if (!m) throw bad("platform", "must look like linux/amd64");
      platform = { os: m[1], arch: m[2] };
    }
  }
  if (platform !== null && (typeof platform.os !== "string" || typeof platform.arch !== "string")) {
    throw bad("platform", "must have os and arch");
  }

  const aliases = table(cfg, "image_aliases");
  for (const [k, v] of Object.entries(aliases)) {
    if (typeof v !== "string" || !v) throw bad("image_aliases", `maps '${k}' to something that is not an image name`);
  }

  const defaultImage = text(cfg.default_image ?? DEFAULTS.default_image);
  if (typeof defaultImage !== "string" || !defaultImage) throw bad("default_image", "must name an image");

  const registryUser = text(cfg.registry_username);
  const registryPassword = cfg.registry_password == null ? "" : String(cfg.registry_password);
  if (registryPassword && !registryUser) throw bad("registry_username", "is needed with registry_password");

  const apiKey = cfg.api_key == null ? "" : String(cfg.api_key).trim();
  if (/[\r\n]/.test(apiKey)) throw bad("api_key", "contains a line break");

  return {
    api,
    apiKey,
    protocol,
    useServerProxy: bool(cfg, "use_server_proxy"),
    defaultImage,
    aliases,
    entrypoint,
    readyTimeoutMs: Math.round(readyTimeout * 1000),
    pollIntervalMs: Math.round(pollInterval * 1000),
    registry: registryUser ? { username: registryUser, password: registryPassword } : null,
    networkPolicy,
    platform,
    secureAccess: bool(cfg, "secure_access"),
  };
}

// The image a template names: an alias, else the template itself (an image reference), else
// the default image.
export function imageFor(cfg, template) {
  if (template == null || template === "") return cfg.defaultImage;
  return cfg.aliases[template] ?? template;
}
