//! Moving a least-connection pick: the controller's batch of moved picks rewritten into their
//! `KPR-LC-` chains in one `iptables-restore`.

use super::*;

/// Rewrites a least-connection chain when the controller moves its pick.
pub(super) struct IptSteer {
    pub(super) tool: exec::Tool,
    pub(super) targets: Arc<Mutex<HashMap<u32, LcTarget>>>,
}

impl Steer for IptSteer {
    fn steer(&mut self, changes: &[PickChange]) -> Result<(), DataplaneError> {
        let targets = self
            .targets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut script = String::from("*nat\n");
        let mut rules = String::new();
        for c in changes {
            let Some(t) = targets.get(&c.id) else {
                continue;
            };
            let _ = writeln!(script, ":{} - [0:0]", t.chain);
            for rule in t.pick_rules(&c.new) {
                rules.push_str(&rule);
                rules.push('\n');
            }
        }
        script.push_str(&rules);
        script.push_str("COMMIT\n");
        exec::restore(self.tool, &script)
    }
}
