-- Every end-user policy: a replica's copy (EndUserPolicyOf).
SELECT * FROM end_user_policies
