"""The data folders tests/cache_fixtures.py writes follow the gen-data contract."""

from __future__ import annotations

from cache_fixtures import conversations, write_data_folder

from eagle3cli.run_folder.manifest import read_manifest, verify_shards


def test_data_folder_follows_the_contract(tmp_path, tiny_target_dir):
    recs = conversations(10)
    d = write_data_folder(tmp_path / "data", tiny_target_dir, recs, per_shard=4)
    m = read_manifest(d, "gen-data", "eagle3 gen-data")
    assert [s["records"] for s in m["shards"]] == [4, 4, 2]
    assert verify_shards(d, m["shards"]) == []
    assert m["target"]["num_hidden_layers"] == 4 and m["regenerated"] is True
    assert sum(len(r["messages"]) == 5 for r in recs) == 3
