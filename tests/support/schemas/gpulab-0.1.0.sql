-- gpulab 0.1.0's database (no schema revision): the tables its models made (db.py at
-- commit 7f83243, create_all on SQLite), with rows of every table; the secret is
-- encrypted with tests/unit/test_migrations.py's KEY (see its docstring).
BEGIN TRANSACTION;
CREATE TABLE disk_bookings (
	id INTEGER NOT NULL,
	instance VARCHAR(64) NOT NULL,
	owner VARCHAR(255) NOT NULL,
	workload VARCHAR(255) NOT NULL,
	volume VARCHAR(255) NOT NULL,
	node VARCHAR(255) NOT NULL,
	kind VARCHAR(16) NOT NULL,
	bytes BIGINT NOT NULL,
	since DATETIME NOT NULL,
	PRIMARY KEY (id),
	UNIQUE (instance, node, volume)
);
INSERT INTO "disk_bookings" VALUES(1,'lab','ann','J0001','lab-job-j0001-data','','pull',5368709120,'2026-11-26 14:00:00.000000');
CREATE TABLE gpu_allocations (
	id INTEGER NOT NULL,
	instance VARCHAR(64) NOT NULL,
	device VARCHAR(128) NOT NULL,
	share INTEGER NOT NULL,
	workload VARCHAR(255) NOT NULL,
	kind VARCHAR(32) NOT NULL,
	owner VARCHAR(255) NOT NULL,
	since DATETIME NOT NULL,
	PRIMARY KEY (id),
	UNIQUE (instance, device, share)
);
INSERT INTO "gpu_allocations" VALUES(1,'lab','0',0,'J0001','job','ann','2026-11-26 14:00:00.000000');
INSERT INTO "gpu_allocations" VALUES(2,'lab','1',0,'ann/nb','notebook','ann','2026-11-26 14:00:00.000000');
CREATE TABLE job_events (
	id INTEGER NOT NULL,
	job_id VARCHAR(32) NOT NULL,
	at DATETIME NOT NULL,
	kind VARCHAR(32) NOT NULL,
	state VARCHAR(32) NOT NULL,
	reason VARCHAR(64) NOT NULL,
	message TEXT NOT NULL,
	exit_code INTEGER,
	PRIMARY KEY (id),
	FOREIGN KEY(job_id) REFERENCES jobs (id)
);
INSERT INTO "job_events" VALUES(1,'J0001','2026-11-26 14:00:00.000000','transition','QUEUED','','',NULL);
INSERT INTO "job_events" VALUES(2,'J0001','2026-11-26 14:00:01.000000','transition','INITIALIZING','','',NULL);
INSERT INTO "job_events" VALUES(3,'J0001','2026-11-26 14:00:02.000000','transition','PENDING','','',NULL);
INSERT INTO "job_events" VALUES(4,'J0001','2026-11-26 14:00:03.000000','transition','RUNNING','','',NULL);
INSERT INTO "job_events" VALUES(5,'J0001','2026-11-26 14:05:00.000000','fault-recovery','RUNNING','HANG','no progress for 10m',NULL);
INSERT INTO "job_events" VALUES(6,'J0002','2026-11-26 14:00:00.000000','transition','QUEUED','','',NULL);
INSERT INTO "job_events" VALUES(7,'J0002','2026-11-26 14:01:00.000000','transition','DONE','COMPLETED','exit code 0',0);
CREATE TABLE jobs (
	id VARCHAR(32) NOT NULL,
	instance VARCHAR(64) NOT NULL,
	owner VARCHAR(255) NOT NULL,
	name VARCHAR(63) NOT NULL,
	spec TEXT NOT NULL,
	state VARCHAR(32) NOT NULL,
	priority INTEGER NOT NULL,
	submitted DATETIME NOT NULL,
	updated DATETIME NOT NULL,
	running_since DATETIME,
	container VARCHAR(255) NOT NULL,
	devices VARCHAR(255) NOT NULL,
	node VARCHAR(255) DEFAULT '' NOT NULL,
	over_quota INTEGER NOT NULL,
	restarts INTEGER NOT NULL,
	hang_restarts INTEGER NOT NULL,
	exit_code INTEGER,
	reason VARCHAR(64) NOT NULL,
	message TEXT NOT NULL,
	request VARCHAR(32) NOT NULL,
	outcome VARCHAR(32) DEFAULT '' NOT NULL,
	groups TEXT NOT NULL,
	PRIMARY KEY (id)
);
INSERT INTO "jobs" VALUES('J0001','lab','ann','train','{"command": ["python", "train.py"], "resources": {"gpus": 1}}','RUNNING',50,'2026-11-26 14:00:00.000000','2026-11-26 14:00:00.000000','2026-11-26 14:00:00.000000','lab-job-j0001','0','',0,1,0,NULL,'','','','','team');
INSERT INTO "jobs" VALUES('J0002','lab','bob','eval','{"command": ["true"]}','DONE',40,'2026-11-26 14:00:00.000000','2026-11-26 14:00:00.000000',NULL,'','','',0,0,0,0,'COMPLETED','exit code 0','','','');
CREATE TABLE leases (
	name VARCHAR(128) NOT NULL,
	holder VARCHAR(255) NOT NULL,
	expires DATETIME NOT NULL,
	term INTEGER NOT NULL,
	PRIMARY KEY (name)
);
INSERT INTO "leases" VALUES('lab','host:1234','2026-11-26 14:00:00.000000',3);
CREATE TABLE notebook_events (
	id INTEGER NOT NULL,
	notebook_id INTEGER NOT NULL,
	at DATETIME NOT NULL,
	state VARCHAR(32) NOT NULL,
	reason VARCHAR(64) NOT NULL,
	message TEXT NOT NULL,
	exit_code INTEGER,
	PRIMARY KEY (id),
	FOREIGN KEY(notebook_id) REFERENCES notebooks (id)
);
INSERT INTO "notebook_events" VALUES(1,1,'2026-11-26 14:00:00.000000','STARTING','','',NULL);
INSERT INTO "notebook_events" VALUES(2,1,'2026-11-26 14:00:30.000000','RUNNING','','',NULL);
CREATE TABLE notebooks (
	id INTEGER NOT NULL,
	instance VARCHAR(64) NOT NULL,
	user VARCHAR(255) NOT NULL,
	server VARCHAR(255) NOT NULL,
	state VARCHAR(32) NOT NULL,
	options TEXT,
	user_options TEXT,
	container VARCHAR(255) NOT NULL,
	node VARCHAR(255) DEFAULT '' NOT NULL,
	created DATETIME NOT NULL,
	updated DATETIME NOT NULL,
	running_since DATETIME,
	stop_reason VARCHAR(64) NOT NULL,
	stop_message TEXT NOT NULL,
	PRIMARY KEY (id),
	UNIQUE (instance, user, server)
);
INSERT INTO "notebooks" VALUES(1,'lab','ann','nb','RUNNING','{"framework": "pytorch", "gpus": 1}','{"framework": "pytorch", "flavor": "gpu-1"}','lab-nb-ann-nb','','2026-11-26 14:00:00.000000','2026-11-26 14:00:00.000000','2026-11-26 14:00:00.000000','','');
CREATE TABLE user_secrets (
	id INTEGER NOT NULL,
	instance VARCHAR(64) NOT NULL,
	owner VARCHAR(255) NOT NULL,
	name VARCHAR(64) NOT NULL,
	token TEXT NOT NULL,
	created DATETIME NOT NULL,
	updated DATETIME NOT NULL,
	PRIMARY KEY (id),
	UNIQUE (instance, owner, name)
);
INSERT INTO "user_secrets" VALUES(1,'lab','ann','hf','gAAAAABrCF2OY1_bSHxl2455jsZN6pGS6m6vY8qj3nAeVNioqKAvlRQxvsDsgmpcQZOlZx0AAN71MKEZqntxHHl2iK4N_eqMc_C_VhiF2ecuFzsTemmyS5s=','2026-11-26 14:00:00.000000','2026-11-26 14:00:00.000000');
CREATE INDEX ix_notebooks_user ON notebooks (user);
CREATE INDEX ix_gpu_allocations_workload ON gpu_allocations (workload);
CREATE INDEX ix_disk_bookings_workload ON disk_bookings (workload);
CREATE INDEX ix_disk_bookings_owner ON disk_bookings (owner);
CREATE INDEX ix_jobs_owner ON jobs (owner);
CREATE INDEX ix_jobs_instance ON jobs (instance);
CREATE INDEX ix_jobs_state ON jobs (state);
CREATE INDEX ix_user_secrets_owner ON user_secrets (owner);
CREATE INDEX ix_notebook_events_notebook_id ON notebook_events (notebook_id);
CREATE INDEX ix_job_events_job_id ON job_events (job_id);
COMMIT;
