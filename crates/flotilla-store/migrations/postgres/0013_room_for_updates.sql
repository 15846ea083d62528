-- A member's row is rewritten several times in each run that upgrades it (observed, its
-- operation started, upgraded), and each intent twice (its operation named, finished). With
-- full pages every new version went to another page: 267,000 dead rows for 100,000 members
-- in the replicas bench (`resources` held 209 MB for 59 MB of live rows). Pages kept part empty
-- take the new version in place (a HOT update: no new index entry, the old version pruned when
-- the page is next read, without waiting for a vacuum). Pages written from now on.
ALTER TABLE resources SET (fillfactor = 60);
ALTER TABLE intents SET (fillfactor = 60);
