-- When each intent was recorded, so an operation's deadline survives a restart.
ALTER TABLE intents ADD COLUMN recorded_at INTEGER;
