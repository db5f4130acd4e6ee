//! The unprivileged user tests run programs as: `SCALENE_RS_TEST_USER`, by default
//! `scalene-rs-test`, which tools/test_user.sh creates (.ci/run calls it).

/// Its (name, uid, gid), or why there is none to use.
pub fn test_user() -> Result<(String, u32, u32), String> {
    let name = std::env::var("SCALENE_RS_TEST_USER").unwrap_or_else(|_| "scalene-rs-test".into());
    match nix::unistd::User::from_name(&name) {
        Ok(Some(u)) if !u.uid.is_root() => Ok((name, u.uid.as_raw(), u.gid.as_raw())),
        Ok(Some(_)) => Err(format!(
            "user {name} is root: no permission could be denied"
        )),
        Ok(None) => Err(format!("no user {name} (tools/test_user.sh creates it)")),
        Err(e) => Err(format!("cannot look up user {name}: {e}")),
    }
}

/// Whether `setpriv` (util-linux) runs here; None when it does.
pub fn setpriv_missing() -> Option<String> {
    match std::process::Command::new("setpriv")
        .arg("--version")
        .output()
    {
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(format!("`setpriv --version` exits {:?}", o.status.code())),
        Err(e) => Some(format!("no setpriv (util-linux): {e}")),
    }
}
