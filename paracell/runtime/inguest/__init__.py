"""The config.json fields the guest applies: encoded here, enforced by the agent."""
