//! The broker config file (`config.toml` in the config dir): `default_provider`,
//! `enforcement`, the `local` provider's settings. Read by the daemon's composition root and
//! by the providers it configures; written only by `provider/setDefault`.

/// The broker config (`config.toml`: `default_provider`, `enforcement`); empty when missing
/// or unreadable.
pub fn read(config_dir: &std::path::Path) -> toml::Table {
    std::fs::read_to_string(config_dir.join("config.toml"))
        .ok()
        .and_then(|t| toml::from_str::<toml::Table>(&t).ok())
        .unwrap_or_default()
}
